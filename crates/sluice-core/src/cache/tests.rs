#![allow(clippy::unwrap_used)]
use super::*;

fn fields(list: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (n, v) in list {
        map.append(*n, HeaderValue::from_str(v).unwrap());
    }
    map
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn stored(list: &[(&'static str, &str)]) -> Stored {
    Stored::new(
        StatusCode::OK,
        &fields(list),
        Variant::default(),
        (at(0), at(0)),
    )
}

fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

#[test]
fn the_key_has_scheme_host_and_query_and_no_host_has_none() {
    let key = primary_key(true, Some("A.example:8443"), "/p", Some("q=1"));
    assert_eq!(key.as_deref(), Some("https://a.example:8443/p?q=1"));
    assert_ne!(
        primary_key(false, Some("a.example"), "/p", None),
        primary_key(false, Some("b.example"), "/p", None)
    );
    assert_ne!(
        primary_key(false, Some("a.example"), "/p", None),
        primary_key(true, Some("a.example"), "/p", None)
    );
    assert_eq!(primary_key(false, None, "/p", None), None);
}

#[test]
fn what_is_stored() {
    let get = Method::GET;
    let none = HeaderMap::new();
    let ok = StatusCode::OK;
    assert!(storable(
        &get,
        &none,
        ok,
        &fields(&[("cache-control", "max-age=60")])
    ));
    // Heuristic only with a status that allows it.
    assert!(storable(&get, &none, ok, &HeaderMap::new()));
    assert!(!storable(
        &get,
        &none,
        StatusCode::CREATED,
        &HeaderMap::new()
    ));
    assert!(storable(
        &get,
        &none,
        StatusCode::CREATED,
        &fields(&[("expires", "x")])
    ));
    for cc in ["no-store", "private", "max-age=5, private"] {
        assert!(
            !storable(&get, &none, ok, &fields(&[("cache-control", cc)])),
            "{cc}"
        );
    }
    assert!(!storable(
        &Method::POST,
        &none,
        ok,
        &fields(&[("cache-control", "max-age=60")])
    ));
    let no_store = fields(&[("cache-control", "no-store")]);
    assert!(!storable(
        &get,
        &no_store,
        ok,
        &fields(&[("cache-control", "max-age=60")])
    ));
    assert!(!storable(&get, &none, ok, &fields(&[("vary", "*")])));
    assert!(!storable(
        &get,
        &none,
        ok,
        &fields(&[("set-cookie", "a=b")])
    ));
    assert!(!storable(
        &get,
        &none,
        StatusCode::PARTIAL_CONTENT,
        &fields(&[("cache-control", "max-age=60")])
    ));
}

#[test]
fn a_request_with_authorization_is_stored_only_when_the_answer_says_it_is_shared() {
    let auth = fields(&[("authorization", "Basic YTpi")]);
    let max_age = fields(&[("cache-control", "max-age=60")]);
    assert!(!storable(&Method::GET, &auth, StatusCode::OK, &max_age));
    for cc in [
        "max-age=60, public",
        "s-maxage=60",
        "max-age=60, must-revalidate",
    ] {
        let res = fields(&[("cache-control", cc)]);
        assert!(storable(&Method::GET, &auth, StatusCode::OK, &res), "{cc}");
    }
}

#[test]
fn freshness_from_s_maxage_max_age_expires_and_heuristic() {
    let d = |l: &[(&'static str, &str)]| stored(l).freshness_lifetime().as_secs();
    assert_eq!(d(&[("cache-control", "max-age=60, s-maxage=10")]), 10);
    assert_eq!(d(&[("cache-control", "max-age=60")]), 60);
    let date = http_date(at(0));
    let expires = http_date(at(300));
    assert_eq!(d(&[("date", &date), ("expires", &expires)]), 300);
    assert_eq!(d(&[("expires", "0")]), 0);
    let modified = http_date(at(0) - Duration::from_secs(1000));
    assert_eq!(d(&[("date", &date), ("last-modified", &modified)]), 100);
    assert_eq!(d(&[]), 0);
}

#[test]
fn age_counts_the_upstream_age_the_delay_and_the_residence() {
    let mut s = stored(&[("age", "30")]);
    s.request_time = at(0);
    s.response_time = at(2);
    assert_eq!(s.current_age(at(12)).as_secs(), 30 + 2 + 10);
    let date = http_date(at(0) - Duration::from_secs(100));
    let s = stored(&[("date", &date)]);
    assert_eq!(s.current_age(at(0)).as_secs(), 100);
}

#[test]
fn use_fresh_stale_and_the_request_directives() {
    let s = stored(&[("cache-control", "max-age=60")]);
    let req = |cc: &str| directives(&fields(&[("cache-control", cc)]));
    let none = Directives::default();
    assert_eq!(usable(&s, &none, at(10)), Use::Fresh);
    assert_eq!(usable(&s, &none, at(61)), Use::Revalidate);
    assert_eq!(usable(&s, &req("max-age=5"), at(10)), Use::Revalidate);
    assert_eq!(usable(&s, &req("min-fresh=55"), at(10)), Use::Revalidate);
    assert_eq!(usable(&s, &req("max-stale=100"), at(61)), Use::Fresh);
    assert_eq!(usable(&s, &req("no-cache"), at(1)), Use::Revalidate);
    let strict = stored(&[("cache-control", "max-age=60, must-revalidate")]);
    assert_eq!(usable(&strict, &req("max-stale"), at(61)), Use::Revalidate);
    let no_cache = stored(&[("cache-control", "max-age=60, no-cache")]);
    assert_eq!(usable(&no_cache, &none, at(1)), Use::Revalidate);
    let pragma = request_directives(&fields(&[("pragma", "no-cache")]));
    assert!(pragma.no_cache);
}

#[test]
fn vary_keys_by_the_listed_fields_normalised() {
    let res = fields(&[
        ("vary", "Accept-Language, accept-language"),
        ("vary", "X-A"),
    ]);
    let names = vary_names(&res).unwrap();
    assert_eq!(names, ["accept-language", "x-a"]);
    let variant = Variant::of(&names, &fields(&[("accept-language", "en,  fr")]));
    assert!(variant.matches(&fields(&[("accept-language", "en, fr")])));
    assert!(variant.matches(&fields(&[
        ("accept-language", "en"),
        ("accept-language", "fr")
    ])));
    assert!(!variant.matches(&fields(&[("accept-language", "de")])));
    assert!(!variant.matches(&fields(&[("accept-language", "en,fr"), ("x-a", "1")])));
    assert_eq!(vary_names(&fields(&[("vary", "a, *")])), None);
}

#[test]
fn revalidation_sends_validators_and_a_304_refreshes_the_fields() {
    let s = stored(&[
        ("etag", "\"v1\""),
        ("last-modified", &http_date(at(0))),
        ("x-a", "old"),
    ]);
    let sent: Vec<_> = s.validators().into_iter().map(|(n, _)| n).collect();
    assert_eq!(sent, [header::IF_NONE_MATCH, header::IF_MODIFIED_SINCE]);
    let fresh = s.refreshed(
        &fields(&[("x-a", "new"), ("content-length", "0")]),
        (at(5), at(6)),
    );
    assert_eq!(fresh.fields["x-a"], "new");
    assert_eq!(fresh.response_time, at(6));
    assert!(!fresh.fields.contains_key("content-length"));
}

#[test]
fn a_clients_conditional_request_is_answered_from_storage() {
    let s = stored(&[("etag", "\"v1\""), ("last-modified", &http_date(at(0)))]);
    assert!(not_modified(
        &fields(&[("if-none-match", "\"x\", W/\"v1\"")]),
        &s
    ));
    assert!(!not_modified(&fields(&[("if-none-match", "\"x\"")]), &s));
    assert!(not_modified(
        &fields(&[("if-modified-since", &http_date(at(10)))]),
        &s
    ));
    assert!(!not_modified(
        &fields(&[(
            "if-modified-since",
            &http_date(at(0) - Duration::from_secs(10))
        )]),
        &s
    ));
}

#[test]
fn private_and_no_cache_listed_fields_and_hop_by_hop_are_not_stored() {
    let s = stored(&[
        (
            "cache-control",
            "max-age=9, private=\"x-secret\", no-cache=\"x-b\"",
        ),
        ("x-secret", "s"),
        ("x-b", "b"),
        ("connection", "close"),
        ("x-ok", "1"),
    ]);
    assert!(!s.fields.contains_key("x-secret"));
    assert!(!s.fields.contains_key("x-b"));
    assert!(!s.fields.contains_key("connection"));
    assert!(s.fields.contains_key("x-ok"));
}

#[test]
fn unsafe_methods_invalidate_on_success_only() {
    assert!(invalidates(&Method::POST, StatusCode::OK));
    assert!(invalidates(&Method::DELETE, StatusCode::MOVED_PERMANENTLY));
    assert!(!invalidates(
        &Method::POST,
        StatusCode::INTERNAL_SERVER_ERROR
    ));
    assert!(!invalidates(&Method::GET, StatusCode::OK));
}

#[test]
fn cdn_cache_control_wins_over_cache_control() {
    let s = stored(&[
        ("cache-control", "no-store"),
        ("cdn-cache-control", "max-age=30"),
    ]);
    assert_eq!(s.freshness_lifetime().as_secs(), 30);
    let res = fields(&[
        ("cache-control", "max-age=60"),
        ("cdn-cache-control", "private"),
    ]);
    assert!(!storable(
        &Method::GET,
        &HeaderMap::new(),
        StatusCode::OK,
        &res
    ));
    let res = fields(&[
        ("cache-control", "no-store"),
        ("cdn-cache-control", "max-age=5"),
    ]);
    assert!(storable(
        &Method::GET,
        &HeaderMap::new(),
        StatusCode::OK,
        &res
    ));
    // An invalid structured field is ignored: Cache-Control decides.
    for bad in ["max-age=10000, &&&&&", "max-age=\"10000\""] {
        let res = fields(&[("cache-control", "no-store"), ("cdn-cache-control", bad)]);
        let ok = StatusCode::OK;
        assert!(
            !storable(&Method::GET, &HeaderMap::new(), ok, &res),
            "{bad}"
        );
    }
}

#[test]
fn of_a_list_based_age_the_first_member_counts_and_an_invalid_one_is_ignored() {
    assert_eq!(
        stored(&[("age", "7200, 0")]).current_age(at(0)).as_secs(),
        7200
    );
    assert_eq!(stored(&[("age", "old")]).current_age(at(0)).as_secs(), 0);
}

#[test]
fn fields_named_by_connection_are_not_stored() {
    let s = stored(&[("connection", "a, B"), ("a", "1"), ("b", "2"), ("c", "3")]);
    assert!(!s.fields.contains_key("a") && !s.fields.contains_key("b"));
    assert!(s.fields.contains_key("c"));
}

#[test]
fn stale_if_error_serves_within_its_window_unless_forbidden() {
    let none = Directives::default();
    let s = stored(&[("cache-control", "max-age=10, stale-if-error=60")]);
    assert!(stale_if_error(&s, &none, at(30)));
    assert!(!stale_if_error(&s, &none, at(71)));
    let plain = stored(&[("cache-control", "max-age=10")]);
    assert!(!stale_if_error(&plain, &none, at(30)));
    let asked = directives(&fields(&[("cache-control", "stale-if-error=100")]));
    assert!(stale_if_error(&plain, &asked, at(30)));
    let strict = stored(&[(
        "cache-control",
        "max-age=10, stale-if-error=60, must-revalidate",
    )]);
    assert!(!stale_if_error(&strict, &none, at(30)));
}

#[test]
fn an_assigned_lifetime_counts_where_the_answer_states_none() {
    let (get, none, found) = (Method::GET, HeaderMap::new(), StatusCode::FOUND);
    let moved = fields(&[("location", "/elsewhere")]);
    assert!(!storable(&get, &none, found, &moved));
    assert!(storable_with(&get, &none, found, &moved, true));
    let no_store = fields(&[("cache-control", "no-store")]);
    assert!(!storable_with(&get, &none, StatusCode::OK, &no_store, true));
    let mut plain = stored(&[]);
    assert_eq!(plain.freshness_lifetime(), Duration::ZERO);
    plain.assigned = Some(Duration::from_secs(600));
    assert_eq!(plain.freshness_lifetime(), Duration::from_secs(600));
    assert!(plain.refreshed(&none, (at(1), at(1))).assigned.is_some());
    let mut own = stored(&[("cache-control", "max-age=5")]);
    own.assigned = Some(Duration::from_secs(600));
    assert_eq!(own.freshness_lifetime(), Duration::from_secs(5));
}

#[test]
fn stale_while_revalidate_serves_within_its_window_unless_forbidden_or_asked_fresher() {
    let none = Directives::default();
    let s = stored(&[("cache-control", "max-age=10, stale-while-revalidate=60")]);
    assert!(stale_while_revalidate(&s, &none, at(30)));
    assert!(!stale_while_revalidate(&s, &none, at(71)));
    let plain = stored(&[("cache-control", "max-age=10")]);
    assert!(!stale_while_revalidate(&plain, &none, at(30)));
    for asked in ["no-cache", "max-age=100", "min-fresh=1"] {
        let asked = directives(&fields(&[("cache-control", asked)]));
        assert!(!stale_while_revalidate(&s, &asked, at(30)));
    }
    for strict in [
        "must-revalidate",
        "proxy-revalidate",
        "s-maxage=10",
        "no-cache",
    ] {
        let cc = format!("max-age=10, stale-while-revalidate=60, {strict}");
        let strict = stored(&[("cache-control", cc.as_str())]);
        assert!(!stale_while_revalidate(&strict, &none, at(30)));
    }
}

#[test]
fn a_head_updates_a_stored_get_with_the_same_validators() {
    let tagged = stored(&[("etag", "\"a\""), ("cache-control", "max-age=1")]);
    assert!(head_updates(&tagged, &fields(&[("etag", "\"a\"")])));
    assert!(!head_updates(&tagged, &fields(&[("etag", "\"b\"")])));
    assert!(!head_updates(&tagged, &HeaderMap::new()));
    let dated = stored(&[("last-modified", "Tue, 01 Dec 2026 00:00:00 GMT")]);
    let same = fields(&[("last-modified", "Tue, 01 Dec 2026 00:00:00 GMT")]);
    assert!(head_updates(&dated, &same));
    assert!(!head_updates(
        &dated,
        &fields(&[("last-modified", "Wed, 02 Dec 2026 00:00:00 GMT")])
    ));
    let bare = stored(&[("cache-control", "max-age=1")]);
    assert!(head_updates(
        &bare,
        &fields(&[("cache-control", "max-age=100")])
    ));
}
