//! [`Verdict`]: what a rate-limit backend answers the tower layer, in one call per request: the
//! decision, and what the response reports of it.

use crate::Decision;
use crate::headers::LimitFigures;
use crate::method::several_limits::SeveralLimits;

/// The answer to one check: allowed or not and, where the response reports it, the
/// [`Decision`] with, for a plan of several limits, each limit's figures, read in the same lookup
/// as the decision, for the `RateLimit-Policy` and `RateLimit` fields (one list item per limit).
///
/// One word: a grant with nothing to report ([`Verdict::allowed`], what a backend answers under
/// [`Figures::OnRefusal`]) is a null pointer, and a reported decision is boxed. The common answer
/// of a layer that reports only refusals, an allowed request, then moves no more than a word on
/// its way from the backend's future to the layer, where an inline decision would be copied, 72
/// bytes at a time, at every step (about 80 instructions of an allowed request, counted by
/// callgrind). A refusal pays one allocation (two for a plan of several limits, whose figures are
/// boxed apart), beside the several its response makes.
///
/// A backend whose plans have one limit makes a reported verdict from its decision, which says
/// all: `Verdict::from(decision)`.
///
/// Verdicts are equal when they report the same: [`Verdict::allowed`] is not equal to a grant
/// that reports its decision, though the layer answers both alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `None` for [`Verdict::allowed`].
    reported: Option<Box<Reported>>,
}

/// A decision with what a response reports of it: for a plan of several limits, each limit's
/// figures. The in-process service answers this where every verdict is reported (under
/// [`Figures::Always`], and to Envoy), so that its readers need not ask whether it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reported {
    decision: Decision,
    /// `None` when the decision's own figures say all (a plan of one limit).
    each_limit: Option<Box<EachLimit>>,
}

/// Each limit's figures, in the plan's order: the first `count` of `figures`.
///
/// Boxed apart from the decision, and made only for a plan of several limits whose figures are
/// reported (a refusal; a grant under [`Figures::Always`]): a single limit's reported decision
/// then allocates its 72 bytes, not the about 220 that four limits' figures inline would add.
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
    /// Refusals' only. An allowed verdict then need say no more than that it was allowed
    /// ([`Verdict::allowed`]); one that reports its decision anyway may leave the figures
    /// incomplete (the permits left reported as 0 where counting them costs more than the
    /// decision, as a sliding log's search of its ring does; a plan's limits not listed).
    OnRefusal,
}

impl Verdict {
    /// An allowed request, with nothing to report: what a backend may answer for a grant under
    /// [`Figures::OnRefusal`], where an allowed response carries no figures. Costs nothing to make.
    #[inline]
    pub const fn allowed() -> Verdict {
        Verdict { reported: None }
    }

    /// Whether the request was allowed.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.reported
            .as_ref()
            .is_none_or(|reported| reported.decision.is_allowed())
    }

    /// The decision, where the verdict reports it: always for a refusal, and for a grant under
    /// [`Figures::Always`]; `None` for [`Verdict::allowed`]. Its figures are those of the limit
    /// that decided (for a plan of several limits: the refusal with the longest wait, else the
    /// grant with the fewest permits left).
    #[inline]
    pub fn decision(&self) -> Option<&Decision> {
        self.reported.as_deref().map(|reported| &reported.decision)
    }

    /// The decision with what the response reports of it; `None` for [`Verdict::allowed`].
    #[inline]
    pub(crate) fn reported(&self) -> Option<&Reported> {
        self.reported.as_deref()
    }
}

impl From<Decision> for Verdict {
    /// The reported verdict of a plan of one limit, whose decision says all.
    #[inline]
    fn from(decision: Decision) -> Verdict {
        Verdict::from(Reported::from(decision))
    }
}

impl From<Reported> for Verdict {
    #[inline]
    fn from(reported: Reported) -> Verdict {
        Verdict {
            reported: Some(Box::new(reported)),
        }
    }
}

impl Reported {
    /// `decision`, with the figures of each of its plan's limits, in the plan's order (at most
    /// [`RateLimiterService::MAX_LIMITS`](crate::RateLimiterService::MAX_LIMITS); any more are
    /// left out).
    pub(crate) fn with_each_limit(
        decision: Decision,
        limits: impl IntoIterator<Item = Decision>,
    ) -> Reported {
        let mut each = EachLimit {
            figures: [LimitFigures::of(&decision); SeveralLimits::MAX_LIMITS],
            count: 0,
        };
        for (slot, limit) in each.figures.iter_mut().zip(limits) {
            *slot = LimitFigures::of(&limit);
            each.count += 1;
        }
        Reported {
            decision,
            each_limit: Some(Box::new(each)),
        }
    }

    /// The decision: allowed or not, and its own figures (see [`Verdict::decision`]).
    #[inline]
    pub(crate) fn decision(&self) -> &Decision {
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

impl From<Decision> for Reported {
    /// The figures of a plan of one limit, whose decision says all.
    #[inline]
    fn from(decision: Decision) -> Reported {
        Reported {
            decision,
            each_limit: None,
        }
    }
}

// A verdict moves as one word: the point of its representation (see `Verdict`).
const _: () = assert!(size_of::<Verdict>() == size_of::<usize>());

#[cfg(test)]
mod tests {
    use super::Verdict;
    use crate::{Decision, Rule};

    #[test]
    fn a_verdict_reports_the_decision_it_was_made_from_and_an_allowed_one_reports_none() {
        let rule = Rule::per_second(5).expect("a rule");
        let quiet = Verdict::allowed();
        assert!(quiet.is_allowed());
        assert_eq!(quiet.decision(), None);
        assert!(quiet.reported().is_none());

        let granted = Decision::allowed(rule, 3, 0);
        let verdict = Verdict::from(granted);
        assert!(verdict.is_allowed());
        assert_eq!(verdict.decision(), Some(&granted));

        let refused = Decision::denied(rule, 0, 1_000_000, 1_000_000);
        let verdict = Verdict::from(refused);
        assert!(!verdict.is_allowed());
        assert_eq!(verdict.decision(), Some(&refused));
        assert_eq!(
            verdict.reported().map(|reported| *reported.decision()),
            Some(refused)
        );
    }
}
