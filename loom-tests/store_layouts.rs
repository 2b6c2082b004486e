//! The store with the sliding window counter, whose word layout depends on the limit (the count
//! fields are as wide as the limit's bits): a request that checked its slot's holding under one
//! version of the plan's limits, and whose exchange comes after the slot changed hands to a
//! holding made under another version (so another layout) whose word holds, in its own layout,
//! the value the request read. Each holding's word is stored XORed with a salt of its own, so the
//! exchange does not land; `negative_controls` shows that without the salts it does, and grants
//! 4 under a limit of 2 (a change from 5 per window to 2 per window at the service's first
//! window, where the two layouts' words coincide).

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

use tollgate::Rule;
use tollgate::loom_support::store::{
    ClientStore, SlotWord, StoreFault, StoreHead, StorePlan, Stored, WordRequest, decide,
};
use tollgate::loom_support::{Admit, CounterParams, Method as Core, Retired};

use crate::support::{FixedClock, explore, one_word_limit};

fn counter(limit: u64) -> CounterParams {
    CounterParams::new(Rule::per_second(limit).expect("a rule")).expect("the counter accepts it")
}

// The counter's constants, as the store's plan hands them out.
one_word_limit!(CounterLimit, CounterParams, empty_since);

struct CounterPlan {
    version: AtomicU64,
    limits: [CounterParams; 2],
}

impl StorePlan for CounterPlan {
    type Limit = CounterLimit;

    fn head(&self) -> StoreHead<CounterLimit> {
        // Acquire: as the table's read of its published version.
        let version = self.version.load(Ordering::Acquire);
        StoreHead {
            version: version as u16,
            kept: true,
            limit: CounterLimit(self.limits[version as usize]),
        }
    }
}

struct CounterRequest;

impl WordRequest<AtomicU64, CounterLimit> for CounterRequest {
    type Answer = bool;

    fn acquire(
        &self,
        limit: &CounterLimit,
        state: &SlotWord<'_, AtomicU64>,
    ) -> Result<bool, Retired> {
        self.acquire_at(limit, state, 0)
    }

    fn acquire_at(
        &self,
        limit: &CounterLimit,
        state: &SlotWord<'_, AtomicU64>,
        now_nanos: u64,
    ) -> Result<bool, Retired> {
        Core::acquire_one(&limit.0, state, &FixedClock(now_nanos))
            .map(|admit| admit == Admit::Granted)
    }

    fn answered(&self, answer: bool) -> bool {
        answer
    }

    fn without_state(&self, _limit: &CounterLimit, _since_nanos: u64) -> Option<bool> {
        None
    }
}

struct Model {
    store: ClientStore<AtomicU64, 2>,
    plan: CounterPlan,
    evicted_up_to: AtomicU64,
}

impl Model {
    fn request(&self, key: u64) -> bool {
        match decide(
            &self.store,
            self.store.place(key),
            &self.plan,
            &CounterRequest,
            &self.evicted_up_to,
            |_| {},
            || 0,
        ) {
            Stored::Answer(granted) => granted,
            other => panic!("the store gave no answer: {other:?}"),
        }
    }
}

/// Alice has taken 1 of 5; a request of hers races the change to 2 per window and three more
/// requests of hers made after it. Under the later limits she may be granted 2 in all, whichever
/// of her requests take them (the racing request's own grant, if made under the earlier limits,
/// comes from the earlier state's 4 left). Each holding's word is salted, so the racing
/// request's exchange, checked against the earlier holding, cannot land on the later one even
/// where the two layouts' words coincide.
pub(crate) fn check_stale_exchange_across_layouts(fault: StoreFault) {
    explore(3, move || {
        let model = Arc::new(Model {
            store: ClientStore::with_fault(2, fault),
            plan: CounterPlan {
                version: AtomicU64::new(0),
                limits: [counter(5), counter(2)],
            },
            evicted_up_to: AtomicU64::new(0),
        });
        assert!(model.request(1), "the prefill is granted");
        let racing = {
            let model = Arc::clone(&model);
            thread::spawn(move || model.request(1))
        };
        // Release: as the table's publication.
        model.plan.version.store(1, Ordering::Release);
        let after: Vec<bool> = (0..3).map(|_| model.request(1)).collect();
        let racing = racing.join().expect("the racing request panicked");
        let under_later = after.iter().filter(|granted| **granted).count();
        assert!(
            under_later <= 2,
            "granted {under_later} of 3 under a limit of 2 (racing request: {racing})"
        );
    });
}

#[test]
fn store_a_stale_exchange_on_a_slot_of_another_layout_grants_no_more() {
    check_stale_exchange_across_layouts(StoreFault::None);
}
