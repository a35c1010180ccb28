//! The standalone acceptor's accounts, free of sockets and tasks: each consumer's open credit
//! and pending recalls per slice, the sessions lent and to whom, the sessions asked of the
//! pools and not yet arrived. The broker asks it whom to lend a session to ([`Ledger::pick`])
//! and whom to ask for sessions back ([`Ledger::recalls`]), and does the sending.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::error::PeerError;

use crate::slice_id::SliceId;

/// The accounts; `T` is what a lent session holds here until it comes back or is gone (its
/// permit, which keeps it counted against the session limits).
#[derive(Debug)]
pub(crate) struct Ledger<T> {
    consumers: BTreeMap<u64, Account>,
    /// Lent sessions by id.
    out: HashMap<u64, Loan<T>>,
    /// Sessions asked of a pool and not yet arrived, per slice.
    in_transit: HashMap<SliceId, usize>,
    next_consumer: u64,
    next_session: u64,
    /// Where the round robin over consumers resumes.
    cursor: u64,
}

#[derive(Debug, Default)]
struct Account {
    credit: HashMap<SliceId, u32>,
    /// Sessions asked back (`RECALL`) and not yet returned or gone, per slice.
    recalled: HashMap<SliceId, usize>,
}

#[derive(Debug)]
struct Loan<T> {
    consumer: u64,
    slice: SliceId,
    held: T,
}

impl<T> Default for Ledger<T> {
    fn default() -> Self {
        Self {
            consumers: BTreeMap::new(),
            out: HashMap::new(),
            in_transit: HashMap::new(),
            next_consumer: 0,
            next_session: 0,
            cursor: 0,
        }
    }
}

/// One consumer as `/status` shows it: per slice, the credit it has open and the sessions lent
/// to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerView {
    /// Its id here (in connection order).
    pub id: u64,
    /// (slice, open credit, sessions lent to it), by slice.
    pub slices: Vec<(SliceId, u32, usize)>,
}

impl<T> Ledger<T> {
    /// Every consumer's credit and loans, by slice.
    pub(crate) fn view(&self) -> Vec<ConsumerView> {
        self.consumers
            .iter()
            .map(|(id, account)| {
                let mut slices: BTreeMap<SliceId, (u32, usize)> = account
                    .credit
                    .iter()
                    .map(|(k, c)| (k.clone(), (*c, 0)))
                    .collect();
                for loan in self.out.values().filter(|l| l.consumer == *id) {
                    slices.entry(loan.slice.clone()).or_default().1 += 1;
                }
                ConsumerView {
                    id: *id,
                    slices: slices.into_iter().map(|(k, (c, l))| (k, c, l)).collect(),
                }
            })
            .collect()
    }

    /// Opens an account for a new consumer; returns its id.
    pub(crate) fn join(&mut self) -> u64 {
        self.next_consumer += 1;
        self.consumers
            .insert(self.next_consumer, Account::default());
        self.next_consumer
    }

    /// Whether `consumer` still has an account.
    pub(crate) fn is_member(&self, consumer: u64) -> bool {
        self.consumers.contains_key(&consumer)
    }

    /// Closes a consumer's account; returns what its lent sessions held (they died with it).
    pub(crate) fn leave(&mut self, consumer: u64) -> Vec<T> {
        self.consumers.remove(&consumer);
        let ids: Vec<u64> = self
            .out
            .iter()
            .filter(|(_, o)| o.consumer == consumer)
            .map(|(id, _)| *id)
            .collect();
        ids.iter()
            .filter_map(|id| self.out.remove(id))
            .map(|o| o.held)
            .collect()
    }

    /// `CREDIT`: `consumer` may receive `n` more sessions of `key`.
    pub(crate) fn credit(&mut self, consumer: u64, key: SliceId, n: u32) {
        if let Some(account) = self.consumers.get_mut(&consumer) {
            let c = account.credit.entry(key).or_default();
            *c = c.saturating_add(n);
        }
    }

    /// Whether `consumer` has ever asked for credit of `key`.
    pub(crate) fn has_asked(&self, consumer: u64, key: &SliceId) -> bool {
        self.consumers
            .get(&consumer)
            .is_some_and(|a| a.credit.contains_key(key))
    }

    /// The consumers that have asked for credit of `key`, ever (they hear about it).
    pub(crate) fn askers(&self, key: &SliceId) -> Vec<u64> {
        self.consumers
            .iter()
            .filter(|(_, a)| a.credit.contains_key(key))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The slices of `cluster` any consumer has asked for credit of.
    pub(crate) fn asked_slices(&self, cluster: &str) -> BTreeSet<SliceId> {
        self.consumers
            .values()
            .flat_map(|a| a.credit.keys())
            .filter(|key| key.cluster == cluster)
            .cloned()
            .collect()
    }

    /// `RETURN` or `GONE` of session `id`: no longer lent (nor owed, if it was recalled).
    /// Another consumer's session, or one nobody holds, is the peer's error.
    pub(crate) fn settle(&mut self, consumer: u64, id: u64) -> Result<(SliceId, T), PeerError> {
        match self.out.remove(&id) {
            Some(out) if out.consumer == consumer => {
                if let Some(account) = self.consumers.get_mut(&consumer) {
                    if let Some(pending) = account.recalled.get_mut(&out.slice) {
                        *pending = pending.saturating_sub(1);
                    }
                }
                Ok((out.slice, out.held))
            }
            Some(out) => {
                self.out.insert(id, out);
                Err(PeerError::LentElsewhere(id))
            }
            None => Err(PeerError::NotLent(id)),
        }
    }

    /// What each slice's pool should be asked for: the consumers' open credit, less the
    /// sessions already on their way.
    pub(crate) fn wanted(&self) -> Vec<(SliceId, usize)> {
        let mut credit: HashMap<&SliceId, usize> = HashMap::new();
        for account in self.consumers.values() {
            for (key, n) in &account.credit {
                *credit.entry(key).or_default() += *n as usize;
            }
        }
        credit
            .into_iter()
            .map(|(key, n)| {
                let moving = self.in_transit.get(key).copied().unwrap_or(0);
                (key.clone(), n.saturating_sub(moving))
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// `n` sessions of `key` were asked of its pool (counted before they leave: one may
    /// arrive before the pool call returns).
    pub(crate) fn asked(&mut self, key: &SliceId, n: usize) {
        *self.in_transit.entry(key.clone()).or_default() += n;
    }

    /// Of the sessions asked of `key`'s pool, `n` will not come (it had fewer idle).
    pub(crate) fn not_coming(&mut self, key: &SliceId, n: usize) {
        if let Some(moving) = self.in_transit.get_mut(key) {
            *moving = moving.saturating_sub(n);
        }
    }

    /// Of `n` sessions asked of `key`'s pool, `got` left it: the rest will not come. A pool
    /// short of the consumers' credit is when consumers above their share are asked to give
    /// some back: the RECALLs due ([`recalls`](Self::recalls)).
    pub(crate) fn pumped(&mut self, key: &SliceId, n: usize, got: usize) -> Vec<(u64, u32)> {
        self.not_coming(key, n - got);
        if got < n {
            self.recalls(key)
        } else {
            Vec::new()
        }
    }

    /// One session asked of `key`'s pool arrived (or closed on the way).
    pub(crate) fn arrived(&mut self, key: &SliceId) {
        self.not_coming(key, 1);
    }

    /// The consumer with credit for `key` that is furthest below its share of the slice's
    /// lent sessions (see [`surplus`]; round robin among equals): takes one of its credits and
    /// returns it with a new session id. By share, not in turn: a quiet consumer that gave a
    /// session back on `RECALL` asks at once to top its idle sessions up again, and in turn it
    /// would get that very session back, never the consumer whose requests wait.
    pub(crate) fn pick(&mut self, key: &SliceId) -> Option<(u64, u64)> {
        let (lent, wanted) = self.holdings(key);
        let demand =
            |id: &u64| lent.get(id).copied().unwrap_or(0) + wanted.get(id).copied().unwrap_or(0);
        let all = wanted.keys().chain(lent.keys()).collect::<BTreeSet<_>>();
        let all: usize = all.into_iter().map(demand).sum();
        // With the session being placed, `total` are lent; share × all = total × demand.
        let total = lent.values().sum::<usize>() + 1;
        let below = |id: &u64| {
            let held = lent.get(id).copied().unwrap_or(0);
            (total * demand(id)) as i128 - (held * all) as i128
        };
        let cursor = self.cursor;
        let mut best: Option<(u64, i128)> = None;
        for id in self
            .consumers
            .range(cursor + 1..)
            .chain(self.consumers.range(..=cursor))
        {
            let id = *id.0;
            if wanted.get(&id).copied().unwrap_or(0) == 0 {
                continue;
            }
            let deficit = below(&id);
            if best.is_none_or(|(_, most)| deficit > most) {
                best = Some((id, deficit));
            }
        }
        let (consumer, _) = best?;
        let account = self.consumers.get_mut(&consumer)?;
        if let Some(n) = account.credit.get_mut(key) {
            *n -= 1;
        }
        self.cursor = consumer;
        self.next_session += 1;
        Some((consumer, self.next_session))
    }

    /// Per consumer: how many sessions of `key` it holds, and its open credit for `key`.
    fn holdings(&self, key: &SliceId) -> (BTreeMap<u64, usize>, BTreeMap<u64, usize>) {
        let mut lent: BTreeMap<u64, usize> = BTreeMap::new();
        for out in self.out.values().filter(|o| &o.slice == key) {
            *lent.entry(out.consumer).or_default() += 1;
        }
        let wanted: BTreeMap<u64, usize> = self
            .consumers
            .iter()
            .filter_map(|(id, a)| Some((*id, *a.credit.get(key)? as usize)))
            .filter(|(_, n)| *n > 0)
            .collect();
        (lent, wanted)
    }

    /// Records session `id` as lent to `consumer`; a consumer gone since it was picked gets
    /// nothing, and `held` comes back (nobody would ever settle the loan).
    pub(crate) fn lend(
        &mut self,
        id: u64,
        consumer: u64,
        slice: SliceId,
        held: T,
    ) -> Result<(), T> {
        if !self.is_member(consumer) {
            return Err(held);
        }
        let loan = Loan {
            consumer,
            slice,
            held,
        };
        self.out.insert(id, loan);
        Ok(())
    }

    /// Forgets a loan whose session never reached its consumer.
    pub(crate) fn unlend(&mut self, id: u64) -> Option<T> {
        self.out.remove(&id).map(|o| o.held)
    }

    /// When a consumer wants sessions of `key` and holds fewer than its share ([`surplus`]),
    /// how many each consumer above its share should give back (`RECALL`); at most one recall
    /// is pending per consumer and slice.
    pub(crate) fn recalls(&mut self, key: &SliceId) -> Vec<(u64, u32)> {
        let (lent, wanted) = self.holdings(key);
        let mut recalls = Vec::new();
        for (id, over) in surplus(&lent, &wanted) {
            let Some(account) = self.consumers.get_mut(&id) else {
                continue;
            };
            let pending = account.recalled.entry(key.clone()).or_default();
            if *pending > 0 {
                continue;
            }
            *pending = over;
            recalls.push((id, u32::try_from(over).unwrap_or(u32::MAX)));
        }
        recalls
    }
}

/// How many of a slice's lent sessions each consumer should give back, given what each holds
/// (`lent`) and what each still asks for (`wanted`, its open credit). Sessions are shared by
/// demand, not evenly: a consumer's share of the lent sessions is in proportion to what it
/// holds plus what it asks for (at least one), so the idle sessions of a quiet consumer move
/// to one whose requests wait. With the pool empty, a consumer that wants sessions and holds
/// fewer than its share gets the excess of those above theirs.
fn surplus(lent: &BTreeMap<u64, usize>, wanted: &BTreeMap<u64, usize>) -> BTreeMap<u64, usize> {
    let share = shares(lent, wanted);
    let get = |m: &BTreeMap<u64, usize>, id: &u64| m.get(id).copied().unwrap_or(0);
    if !wanted.keys().any(|id| get(lent, id) < get(&share, id)) {
        return BTreeMap::new();
    }
    lent.iter()
        .map(|(id, n)| (*id, n.saturating_sub(get(&share, id))))
        .filter(|(_, over)| *over > 0)
        .collect()
}

/// Each consumer's share of the slice's lent sessions, in proportion to its demand (what it
/// holds plus what it asks for), at least one; none with fewer than two consumers sharing.
/// The shares add up to the sessions lent: each gets the whole part of its proportion, and
/// the sessions left over go to the largest fractions (ties: the larger demand, then the
/// older consumer). Rounding every share down instead left a consumer at 4 of a proportion
/// of 4.8 with nobody above theirs: the quiet consumer kept its idle sessions for good.
fn shares(lent: &BTreeMap<u64, usize>, wanted: &BTreeMap<u64, usize>) -> BTreeMap<u64, usize> {
    let total: usize = lent.values().sum();
    let mut sharing: Vec<u64> = lent.keys().chain(wanted.keys()).copied().collect();
    sharing.sort_unstable();
    sharing.dedup();
    if total == 0 || sharing.len() < 2 {
        return BTreeMap::new();
    }
    let get = |m: &BTreeMap<u64, usize>, id: &u64| m.get(id).copied().unwrap_or(0);
    let demand = |id: &u64| get(lent, id) + get(wanted, id);
    let all: usize = sharing.iter().map(demand).sum::<usize>().max(1);
    let mut share: BTreeMap<u64, usize> = sharing
        .iter()
        .map(|id| (*id, total * demand(id) / all))
        .collect();
    let mut by_fraction = sharing.clone();
    by_fraction.sort_by_key(|id| {
        let fraction = total * demand(id) % all;
        (
            std::cmp::Reverse(fraction),
            std::cmp::Reverse(demand(id)),
            *id,
        )
    });
    let left = total.saturating_sub(share.values().sum());
    for id in by_fraction.iter().take(left) {
        *share.entry(*id).or_default() += 1;
    }
    for n in share.values_mut() {
        *n = (*n).max(1);
    }
    share
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(u64, usize)]) -> BTreeMap<u64, usize> {
        pairs.iter().copied().collect()
    }

    /// Issue 13's case: six sessions, three at each of two consumers; consumer 1 has requests
    /// queued (it asks for many more), consumer 2 is idle (it asks only to top up its idle
    /// reserve). The idle sessions must move to where the requests wait.
    #[test]
    fn idle_sessions_move_to_the_consumer_whose_requests_wait() {
        let over = surplus(&map(&[(1, 3), (2, 3)]), &map(&[(1, 13), (2, 1)]));
        assert_eq!(over, map(&[(2, 2)]));
    }

    /// Both loaded alike: nobody gives anything back, so sessions do not bounce.
    #[test]
    fn equal_demand_keeps_an_even_split() {
        let over = surplus(&map(&[(1, 3), (2, 3)]), &map(&[(1, 8), (2, 8)]));
        assert!(over.is_empty(), "{over:?}");
    }

    /// A consumer that holds nothing and wants some gets a share from the one that holds all.
    #[test]
    fn a_newcomer_gets_a_share() {
        // Demand 6 and 4 of 6 sessions: shares 3.6 and 2.4 are 4 and 2 (they add up to 6;
        // rounding both down recalled 3, one more than the newcomer's share).
        let over = surplus(&map(&[(1, 6)]), &map(&[(2, 4)]));
        assert_eq!(over, map(&[(1, 2)]));
    }

    /// Issue 14's two-consumer test (tests/handoff.rs): 4 held and 4 asked for against 2
    /// held idle. Proportions 4.8 and 1.2: the busy consumer is one short, the quiet one gives
    /// one back, and after the move (5 and 1, each topping up) nothing moves again.
    #[test]
    fn a_fraction_short_is_short() {
        let over = surplus(&map(&[(1, 4), (2, 2)]), &map(&[(1, 4)]));
        assert_eq!(over, map(&[(2, 1)]));
        let after = surplus(&map(&[(1, 5), (2, 1)]), &map(&[(1, 3), (2, 1)]));
        assert!(after.is_empty(), "{after:?}");
    }

    /// Once the loaded consumer holds its share, no further recall: the split is stable.
    #[test]
    fn the_split_by_demand_is_stable() {
        let over = surplus(&map(&[(1, 5), (2, 1)]), &map(&[(1, 10), (2, 3)]));
        assert!(over.is_empty(), "{over:?}");
    }

    fn key() -> SliceId {
        SliceId::new("api", "default")
    }

    /// One table row: consumers join, each is lent `held` sessions of the slice and then has
    /// `credit` open; `gone` consumers leave before the recall is computed.
    struct Case {
        name: &'static str,
        /// Per consumer (in joining order): sessions it holds, credit it has open.
        consumers: &'static [(usize, u32)],
        /// Consumers (by joining order, from 1) that have gone away.
        gone: &'static [u64],
        /// The recalls expected: (consumer, sessions asked back).
        recalls: &'static [(u64, u32)],
    }

    fn ledger_for(case: &Case) -> Ledger<()> {
        let mut ledger = Ledger::default();
        for &(held, _) in case.consumers {
            let consumer = ledger.join();
            for _ in 0..held {
                ledger.credit(consumer, key(), 1);
                let (to, id) = ledger.pick(&key()).expect("a consumer with credit");
                assert_eq!(to, consumer, "{}: lent to the one with credit", case.name);
                ledger.lend(id, to, key(), ()).expect("a member");
            }
        }
        for (i, &(_, credit)) in case.consumers.iter().enumerate() {
            ledger.credit(i as u64 + 1, key(), credit);
        }
        for &consumer in case.gone {
            ledger.leave(consumer);
        }
        ledger
    }

    #[test]
    fn recalls_follow_what_is_owed() {
        let cases = [
            Case {
                name: "recall when owed: the one waiting gets the idle one's excess",
                consumers: &[(3, 13), (3, 1)],
                gone: &[],
                recalls: &[(2, 2)],
            },
            Case {
                name: "nothing owed: equal demand",
                consumers: &[(3, 8), (3, 8)],
                gone: &[],
                recalls: &[],
            },
            Case {
                name: "nothing owed: nobody asks for more",
                consumers: &[(3, 0), (3, 0)],
                gone: &[],
                recalls: &[],
            },
            Case {
                name: "several consumers: both holders give to the newcomer",
                consumers: &[(4, 0), (4, 0), (0, 8)],
                gone: &[],
                recalls: &[(1, 2), (2, 2)],
            },
            Case {
                name: "a consumer gone: its sessions count no more, nobody else to ask",
                consumers: &[(6, 0), (0, 4)],
                gone: &[1],
                recalls: &[],
            },
            Case {
                name: "a consumer gone: the rest still share",
                consumers: &[(6, 0), (3, 0), (0, 9)],
                gone: &[2],
                recalls: &[(1, 4)],
            },
        ];
        for case in &cases {
            let mut ledger = ledger_for(case);
            let recalls = ledger.recalls(&key());
            assert_eq!(recalls, case.recalls, "{}", case.name);
        }
    }

    /// A recall stays pending until the sessions come back: no second RECALL meanwhile, and
    /// a new one once they are settled and the split is still off.
    #[test]
    fn one_recall_is_pending_per_consumer_and_slice() {
        let case = Case {
            name: "pending",
            consumers: &[(6, 0), (0, 4)],
            gone: &[],
            recalls: &[],
        };
        let mut ledger = ledger_for(&case);
        // Shares 4 and 2 of 6 (a_newcomer_gets_a_share).
        assert_eq!(ledger.recalls(&key()), [(1, 2)]);
        assert!(ledger.recalls(&key()).is_empty(), "still pending");
        for id in 1..=2 {
            ledger.settle(1, id).expect("lent to consumer 1");
        }
        // Consumer 2 still holds none (the returned ones have not reached it yet).
        assert_eq!(ledger.recalls(&key()), [(1, 2)], "settled: a new recall");
    }

    #[test]
    fn pick_takes_turns_among_consumers_with_credit() {
        let mut ledger: Ledger<()> = Ledger::default();
        let (a, b, c) = (ledger.join(), ledger.join(), ledger.join());
        ledger.credit(a, key(), 2);
        ledger.credit(c, key(), 1);
        let picked: Vec<_> = std::iter::from_fn(|| ledger.pick(&key())).collect();
        assert_eq!(picked, [(a, 1), (c, 2), (a, 3)]);
        assert!(!picked.iter().any(|(to, _)| *to == b), "b has no credit");
    }

    /// The integration test's case (tests/handoff.rs): consumer a has all its sessions busy
    /// and requests queued, b gave one of its two idle sessions back on `RECALL` and asks at
    /// once to top up again. The returned session goes to a, though it is b's turn.
    #[test]
    fn a_session_goes_to_the_consumer_furthest_below_its_share() {
        let mut ledger: Ledger<()> = Ledger::default();
        let (a, b) = (ledger.join(), ledger.join());
        for id in 1..=4 {
            ledger.lend(id, a, key(), ()).expect("a member");
        }
        ledger.lend(5, b, key(), ()).expect("a member");
        ledger.credit(a, key(), 4);
        ledger.credit(b, key(), 1);
        ledger.cursor = a;
        assert_eq!(ledger.pick(&key()), Some((a, 1)));
        // Equally far below their shares, they take turns again.
        let mut even: Ledger<()> = Ledger::default();
        let (c, d) = (even.join(), even.join());
        even.credit(c, key(), 1);
        even.credit(d, key(), 1);
        even.cursor = c;
        assert_eq!(even.pick(&key()), Some((d, 1)));
    }

    #[test]
    fn a_session_is_settled_only_by_its_consumer() {
        let mut ledger: Ledger<&str> = Ledger::default();
        let (a, b) = (ledger.join(), ledger.join());
        ledger.lend(7, a, key(), "permit").expect("a member");
        assert!(matches!(
            ledger.settle(b, 7),
            Err(PeerError::LentElsewhere(7))
        ));
        assert!(matches!(ledger.settle(a, 8), Err(PeerError::NotLent(8))));
        assert_eq!(ledger.settle(a, 7).expect("its own").1, "permit");
    }

    #[test]
    fn a_consumer_gone_gives_up_its_loans_and_gets_no_more() {
        let mut ledger: Ledger<u64> = Ledger::default();
        let (a, b) = (ledger.join(), ledger.join());
        ledger.lend(1, a, key(), 1).expect("a member");
        ledger.lend(2, b, key(), 2).expect("a member");
        ledger.lend(3, a, key(), 3).expect("a member");
        let mut held = ledger.leave(a);
        held.sort_unstable();
        assert_eq!(held, [1, 3]);
        assert_eq!(
            ledger.lend(4, a, key(), 4),
            Err(4),
            "gone since it was picked"
        );
        assert!(ledger.settle(b, 2).is_ok());
    }

    /// Issue 13's case, as the pump meets it: consumer 1's requests wait, consumer 2 holds
    /// idle sessions. Nobody is asked back while the pool fills the credit; once it falls
    /// short, the one above its share is, and the sessions it could not give are not counted
    /// as on their way.
    #[test]
    fn a_pool_short_of_the_credit_recalls_sessions_from_consumers_above_their_share() {
        let case = Case {
            name: "pumped",
            consumers: &[(3, 13), (3, 1)],
            gone: &[],
            recalls: &[],
        };
        let mut ledger = ledger_for(&case);
        let wanted = ledger.wanted();
        assert_eq!(wanted, [(key(), 14)]);
        ledger.asked(&key(), 14);
        assert!(
            ledger.pumped(&key(), 14, 14).is_empty(),
            "filled: no recall"
        );
        assert_eq!(ledger.wanted(), [], "all 14 on their way");
        for _ in 0..14 {
            ledger.arrived(&key());
        }
        ledger.asked(&key(), 14);
        assert_eq!(ledger.pumped(&key(), 14, 0), [(2, 2)]);
        assert_eq!(ledger.wanted(), [(key(), 14)], "none on its way");
    }

    #[test]
    fn sessions_on_their_way_are_not_asked_for_twice() {
        let mut ledger: Ledger<()> = Ledger::default();
        let a = ledger.join();
        ledger.credit(a, key(), 5);
        assert_eq!(ledger.wanted(), [(key(), 5)]);
        ledger.asked(&key(), 5);
        ledger.not_coming(&key(), 2);
        ledger.arrived(&key());
        assert_eq!(
            ledger.wanted(),
            [(key(), 3)],
            "credit 5, 2 still on their way"
        );
    }
}
