//! The sections of BENCHMARKS.md that harnesses other than the criterion suite fill, each between
//! markers of its own, so that each can be rewritten without touching the rest of the file.

use std::path::Path;

pub(crate) type Error = Box<dyn std::error::Error>;

/// A marked section of BENCHMARKS.md.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Section {
    pub(crate) begin: &'static str,
    pub(crate) end: &'static str,
}

/// The instruction counts (`cargo bench --package tollgate-instructions`).
pub(crate) const INSTRUCTIONS: Section = Section {
    begin: "<!-- instructions:begin -->",
    end: "<!-- instructions:end -->",
};

/// A million clients (`--bench footprint`).
pub(crate) const FOOTPRINT: Section = Section {
    begin: "<!-- footprint:begin -->",
    end: "<!-- footprint:end -->",
};

/// Sections written by hand from other harnesses' runs (the Redis backend's, the Envoy
/// service's): no report writes them, and every report keeps them.
pub(crate) const HAND_WRITTEN: Section = Section {
    begin: "<!-- hand-written:begin -->",
    end: "<!-- hand-written:end -->",
};

/// Every marked section, in the order the file has them.
const SECTIONS: [Section; 3] = [INSTRUCTIONS, FOOTPRINT, HAND_WRITTEN];

impl Section {
    /// The section in `text`, markers included, if `text` has both markers in order.
    fn find_in(self, text: &str) -> Option<&str> {
        let first = text.find(self.begin)?;
        let last = text.find(self.end)?;
        (first < last).then(|| &text[first..last + self.end.len()])
    }

    /// Replaces this section of the file at `path` with `section` (which starts and ends with
    /// the markers), or appends it when the file has no such section yet.
    pub(crate) fn write(self, path: &Path, section: &str) -> Result<(), Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        let updated = match (text.find(self.begin), text.find(self.end)) {
            (Some(first), Some(last)) if first < last => {
                format!(
                    "{}{section}{}",
                    &text[..first],
                    &text[last + self.end.len()..]
                )
            }
            (None, None) => append(&text, section),
            _ => {
                return Err(format!(
                    "{} has one of {} and {} without the other, or in the wrong order: mend it \
                     by hand",
                    path.display(),
                    self.begin,
                    self.end
                )
                .into());
            }
        };
        std::fs::write(path, updated)
            .map_err(|error| format!("cannot write {}: {error}", path.display()).into())
    }
}

/// `text`, then every marked section that `kept` has, in order.
pub(crate) fn with_sections_of(text: &str, kept: &str) -> String {
    SECTIONS
        .iter()
        .filter_map(|section| section.find_in(kept))
        .fold(text.to_owned(), |text, section| append(&text, section))
}

/// `text` with `section` after it, a blank line between.
fn append(text: &str, section: &str) -> String {
    format!("{}\n\n{section}\n", text.trim_end())
}

/// `10000` as `10 000`, the way BENCHMARKS.md writes numbers in prose.
pub(crate) fn thousands(number: u64) -> String {
    let digits = number.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(digit);
    }
    out
}
