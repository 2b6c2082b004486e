//! [`Verdict`]: what a rate-limit backend answers the tower layer, in one call per request: the
//! decision, and what the response reports of it.

use crate::Decision;
use crate::headers::LimitFigures;
use crate::method::several_limits::SeveralLimits;

/// The answer to one check: its [`Decision`] and, for a plan of several limits, each limit's
/// figures, read in the same lookup as the decision, for the `RateLimit-Policy` and `RateLimit`
/// fields (one list item per limit). A plan of one limit's verdict is its decision alone, and
/// costs no allocation.
///
/// A backend whose plans have one limit makes it from its decision, which says all:
/// `Verdict::from(decision)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    decision: Decision,
    /// `None` when the decision's own figures say all (a plan of one limit).
    each_limit: Option<Box<EachLimit>>,
}

/// Each limit's figures, in the plan's order: the first `count` of `figures`.
///
/// Boxed, in the verdict, and made only for a plan of several limits whose figures are reported
/// (a refusal; a grant under [`Figures::Always`]): a verdict then stays the size of its decision
/// on its way through the backend's future. Inline, the figures of four limits would make every
/// verdict about 220 bytes, each move of it a call to `memcpy`; a single limit's allowed request
/// through the layer took about 5% more instructions so (counted by callgrind).
#[derive(Debug, Clone, PartialEq, Eq)]
struct EachLimit {
    figures: [LimitFigures; SeveralLimits::MAX_LIMITS],
    count: u8,
}

/// Which verdicts' figures a response reports, so that a backend may skip the work of counting
/// what will not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figures {
    /// Every verdict's: allowed responses carry the `RateLimit` fields too.
    Always,
    /// Refusals' only. An allowed verdict then need say no more than that it was allowed: its
    /// figures may be incomplete (the permits left reported as 0 where counting them costs more
    /// than the decision, as a sliding log's search of its ring does; a plan's limits not listed).
    OnRefusal,
}

impl Verdict {
    /// `decision`, with the figures of each of its plan's limits, in the plan's order (at most
    /// [`RateLimiterService::MAX_LIMITS`](crate::RateLimiterService::MAX_LIMITS); any more are
    /// left out).
    pub(crate) fn with_each_limit(
        decision: Decision,
        limits: impl IntoIterator<Item = Decision>,
    ) -> Verdict {
        let mut each = EachLimit {
            figures: [LimitFigures::of(&decision); SeveralLimits::MAX_LIMITS],
            count: 0,
        };
        for (slot, limit) in each.figures.iter_mut().zip(limits) {
            *slot = LimitFigures::of(&limit);
            each.count += 1;
        }
        Verdict {
            decision,
            each_limit: Some(Box::new(each)),
        }
    }

    /// The decision: allowed or not, and its own figures (for a plan of several limits, those of
    /// the limit that decided: the refusal with the longest wait, else the grant with the fewest
    /// permits left).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// `write` applied to the figures of each limit the fields list: the plan's several limits',
    /// or the decision's own.
    pub(crate) fn with_limits<R>(&self, write: impl FnOnce(&[LimitFigures]) -> R) -> R {
        match &self.each_limit {
            Some(each) if each.count > 0 => write(&each.figures[..usize::from(each.count)]),
            _ => write(&[LimitFigures::of(&self.decision)]),
        }
    }
}

impl From<Decision> for Verdict {
    /// The verdict of a plan of one limit, whose decision says all.
    #[inline]
    fn from(decision: Decision) -> Verdict {
        Verdict {
            decision,
            each_limit: None,
        }
    }
}
