//! The sections of BENCHMARKS.md that harnesses other than the criterion suite fill, each between
//! markers of its own, so that each can be rewritten without touching the rest of the file.

pub(crate) type Error = Box<dyn std::error::Error>;

/// A marked section of BENCHMARKS.md.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Section {
    pub(crate) begin: &'static str,
    pub(crate) end: &'static str,
}

/// The instruction counts (`--bench instructions -- --write`).
pub(crate) const INSTRUCTIONS: Section = Section {
    begin: "<!-- instructions:begin -->",
    end: "<!-- instructions:end -->",
};

/// A million clients (`--bench footprint -- --write`).
pub(crate) const FOOTPRINT: Section = Section {
    begin: "<!-- footprint:begin -->",
    end: "<!-- footprint:end -->",
};

/// Every marked section, in the order the file has them.
const SECTIONS: [Section; 2] = [INSTRUCTIONS, FOOTPRINT];

impl Section {
    /// The section in `text`, markers included, if `text` has both markers in order.
    fn find_in(self, text: &str) -> Option<&str> {
        let first = text.find(self.begin)?;
        let last = text.find(self.end)?;
        (first < last).then(|| &text[first..last + self.end.len()])
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
