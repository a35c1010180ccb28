//! A route's admission — whether a request is let through before anything goes upstream —
//! run once for every transport over the route's registered features ([`RouteFeature`]), in
//! their order: each feature's answer edit is read first, then each admission hook until one
//! refuses (an error answer: 429, 403, 401), answers (a CORS preflight's 204, a cache's hit)
//! or all pass; a request that passes is then given to each feature that keeps something of
//! it on its way upstream and back ([`Keeps`]: a cache storing a miss).

use bytes::Bytes;
use http::{HeaderMap, Response};
use std::sync::Arc;

pub use crate::body::Tees;
use crate::error::ProxyError;
use crate::route_feature::{Answer, Asked, Edit, Keep, Kept, RouteFeature, Verdict};

/// What admission decided of a request.
#[derive(Debug)]
pub enum Outcome {
    /// On to the route's target.
    Pass,
    /// Answered by a feature ([`Admission::answer`] renders it).
    Answer(Answer),
    /// Refused with this error.
    Refused(ProxyError),
    /// Answered by a feature at once; the request still goes upstream in the background for
    /// the [`Keeps`] ([`Verdict::Refresh`]).
    Refresh(Answer),
}

/// A request's admission: its outcome and the answer edits of its route's features.
pub struct Admission {
    /// What became of the request.
    pub outcome: Outcome,
    /// The edits every answer to the request gets ([`Edits::apply`]).
    pub edits: Edits,
    /// What the features keep of a request that passed (empty otherwise).
    pub keeps: Keeps,
}

/// The [`Keep`]s of a request that goes upstream, in the features' order.
#[derive(Default)]
pub struct Keeps(Vec<Box<dyn Keep>>);

impl std::fmt::Debug for Keeps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Keeps").field(&self.0.len()).finish()
    }
}

/// What the [`Keeps`] made of the upstream's answer.
#[derive(Debug)]
pub enum Outbound {
    /// The upstream's answer goes out, its body through these tees.
    Through(Tees),
    /// The answer replaced by a feature's (a revalidated object).
    Replaced(Answer),
}

impl Keeps {
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Lets each edit the request's fields on their way upstream.
    pub fn ask(&mut self, fields: &mut HeaderMap) {
        for keep in &mut self.0 {
            keep.ask(fields);
        }
    }

    /// Tells each the upstream failed; the first answer in place of the error decides.
    pub fn failed(self, error: &ProxyError) -> Option<Answer> {
        self.0.into_iter().find_map(|keep| keep.failed(error))
    }

    /// Hands each the upstream's answer head; the first that replaces the answer decides.
    pub fn answer(self, head: &mut http::response::Parts) -> Outbound {
        let mut tees = Vec::new();
        for keep in self.0 {
            match keep.answer(head) {
                Kept::Leave => {}
                Kept::Tee(tee) => tees.push(tee),
                Kept::Replace(answer) => return Outbound::Replaced(answer),
            }
        }
        Outbound::Through(Tees::new(tees))
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("outcome", &self.outcome)
            .field("edits", &self.edits.0.len())
            .field("keeps", &self.keeps)
            .finish()
    }
}

/// The answer edits of a request's features ([`RouteFeature::edit`]), in their order.
#[derive(Default)]
pub struct Edits(Vec<(usize, Edit)>);

impl std::fmt::Debug for Edits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Edits").field(&self.0.len()).finish()
    }
}

impl Edits {
    /// Applies every edit to an answer's fields.
    pub fn apply(self, fields: &mut HeaderMap) {
        for (_, edit) in self.0 {
            edit(fields);
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Leaves out the edit of the feature at `index` (the one that refused).
    fn without(mut self, index: usize) -> Self {
        self.0.retain(|(i, _)| *i != index);
        self
    }
}

/// Runs `features`' hooks over `asked`.
pub async fn admit(features: &[Arc<dyn RouteFeature>], asked: &Asked<'_>) -> Admission {
    let edits = features
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.edit(asked).map(|e| (i, e)));
    let edits = Edits(edits.collect());
    for (i, feature) in features.iter().enumerate() {
        let verdict = match feature.admit(asked) {
            Verdict::Check(check) => match check.await {
                Ok(None) => Verdict::Pass,
                Ok(Some(answer)) => Verdict::Answer(answer),
                Err(e) => Verdict::Refuse(e),
            },
            other => other,
        };
        let outcome = match verdict {
            Verdict::Pass | Verdict::Check(_) => continue,
            Verdict::Refuse(e) => Outcome::Refused(e),
            Verdict::Answer(a) => Outcome::Answer(a),
            Verdict::Refresh(a) => {
                let keeps = features.iter().filter_map(|f| f.keep(asked)).collect();
                return Admission {
                    outcome: Outcome::Refresh(a),
                    edits,
                    keeps: Keeps(keeps),
                };
            }
        };
        let edits = match outcome {
            Outcome::Refused(_) => edits.without(i),
            _ => edits,
        };
        return Admission {
            outcome,
            edits,
            keeps: Keeps::default(),
        };
    }
    let keeps = features.iter().filter_map(|f| f.keep(asked)).collect();
    Admission {
        outcome: Outcome::Pass,
        edits,
        keeps: Keeps(keeps),
    }
}

impl Answer {
    /// The answer as a response (its body, if any, beside it): `edits` applied first, then
    /// its fields.
    pub fn render(self, edits: Edits) -> (Response<()>, Option<Bytes>) {
        let mut res = Response::new(());
        *res.status_mut() = self.status;
        edits.apply(res.headers_mut());
        for (name, value) in self.fields {
            res.headers_mut().append(name, value);
        }
        (res, self.body)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::route_feature::Hooks;
    use http::{HeaderValue, Method, StatusCode};

    /// A feature that records its name into every answer and decides as told.
    #[derive(Debug)]
    struct Probe {
        tag: &'static str,
        decide: fn() -> Verdict<'static>,
    }

    impl RouteFeature for Probe {
        fn name(&self) -> &'static str {
            self.tag
        }
        fn hooks(&self) -> Hooks {
            Hooks::ALL
        }
        fn edit(&self, _: &Asked<'_>) -> Option<Edit> {
            let tag = self.tag;
            Some(Box::new(move |h: &mut HeaderMap| {
                h.append("x-edit", HeaderValue::from_static(tag));
            }))
        }
        fn admit<'a>(&'a self, _: &Asked<'a>) -> Verdict<'a> {
            (self.decide)()
        }
    }

    fn probe(tag: &'static str, decide: fn() -> Verdict<'static>) -> Arc<dyn RouteFeature> {
        Arc::new(Probe { tag, decide })
    }

    async fn run(features: &[Arc<dyn RouteFeature>]) -> (String, Vec<String>) {
        let fields = HeaderMap::new();
        let asked = Asked {
            method: &Method::GET,
            fields: &fields,
            client: [127, 0, 0, 1].into(),
            path: "/",
            query: None,
            host: None,
            tls: false,
        };
        let admission = admit(features, &asked).await;
        let outcome = format!("{:?}", admission.outcome);
        let mut out = HeaderMap::new();
        admission.edits.apply(&mut out);
        let edits = out.get_all("x-edit").iter();
        let edits = edits.map(|v| v.to_str().unwrap().to_owned());
        (outcome, edits.collect())
    }

    #[tokio::test]
    async fn hooks_run_in_order_and_a_refuser_does_not_dress_its_refusal() {
        let refuse = || Verdict::Refuse(ProxyError::NoRoute);
        let never = || -> Verdict<'static> { panic!("a hook after a refusal ran") };
        let (outcome, edits) = run(&[
            probe("a", || Verdict::Pass),
            probe("b", refuse),
            probe("c", never),
        ])
        .await;
        assert!(outcome.starts_with("Refused"), "{outcome}");
        // Every edit but the refuser's, the later features' included.
        assert_eq!(edits, ["a", "c"]);
    }

    #[tokio::test]
    async fn a_wait_that_fails_refuses_and_one_that_passes_goes_on() {
        let failing = || Verdict::Check(Box::pin(async { Err(ProxyError::NoRoute) }));
        let passing = || Verdict::Check(Box::pin(async { Ok(None) }));
        let (outcome, _) = run(&[probe("a", passing), probe("b", failing)]).await;
        assert!(outcome.starts_with("Refused"), "{outcome}");
        let (outcome, edits) = run(&[probe("a", passing), probe("b", passing)]).await;
        assert_eq!(outcome, "Pass");
        assert_eq!(edits, ["a", "b"]);
    }

    #[tokio::test]
    async fn an_answer_gets_every_edit_then_its_own_fields() {
        let answer = || {
            Verdict::Answer(Answer::bare(
                StatusCode::NO_CONTENT,
                vec![("x-edit".parse().unwrap(), HeaderValue::from_static("own"))],
            ))
        };
        let features = [probe("a", answer), probe("b", || Verdict::Pass)];
        let fields = HeaderMap::new();
        let asked = Asked {
            method: &Method::OPTIONS,
            fields: &fields,
            client: [127, 0, 0, 1].into(),
            path: "/",
            query: None,
            host: None,
            tls: false,
        };
        let admission = admit(&features, &asked).await;
        let Outcome::Answer(answer) = admission.outcome else {
            panic!("not answered: {admission:?}");
        };
        let (res, _) = answer.render(admission.edits);
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        let got: Vec<_> = res.headers().get_all("x-edit").iter().collect();
        assert_eq!(got, ["a", "b", "own"]);
    }
}
