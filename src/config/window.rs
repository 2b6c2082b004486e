//! Windows written as text: `"500ms"`, `"1s"`, `"1h30m"`.

use std::time::Duration;

use crate::Rule;

/// Each unit a window may be written in, with its length in nanoseconds.
const UNITS: [(&str, u128); 9] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("min", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// The units a window is written back in, longest first; `us` rather than `µs` to stay ASCII.
const WRITTEN_UNITS: [(&str, u128); 7] = [
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

/// Why a window's text was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowError {
    /// Not whole numbers each followed by a unit.
    Unparsable,
    /// Longer than [`Rule::MAX_WINDOW`], however far beyond.
    TooLong,
}

/// Parses a window: one or more whole numbers each followed by a unit (`ns`, `us` or `µs`, `ms`,
/// `s`, `m` or `min`, `h`, `d`), with optional spaces, such as `"500ms"`, `"2 m"` or `"1h30m"`.
pub(crate) fn parse_window(text: &str) -> Result<Duration, WindowError> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(WindowError::Unparsable);
    }
    // u128 nanoseconds, saturating: a sum past any Duration is still just "too long".
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(WindowError::Unparsable);
        }
        let (number, after) = rest.split_at(digits);
        let number = number.bytes().fold(0u128, |sum, digit| {
            sum.saturating_mul(10)
                .saturating_add(u128::from(digit - b'0'))
        });
        let after = after.trim_start();
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c.is_whitespace())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let (_, nanos_per_unit) = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .ok_or(WindowError::Unparsable)?;
        total = total.saturating_add(number.saturating_mul(*nanos_per_unit));
        rest = after.trim_start();
    }
    if total > Rule::MAX_WINDOW.as_nanos() {
        return Err(WindowError::TooLong);
    }
    // At most MAX_WINDOW's 2^63 nanoseconds, so the conversion cannot fail.
    u64::try_from(total)
        .map(Duration::from_nanos)
        .map_err(|_| WindowError::TooLong)
}

/// Writes a window the way [`parse_window`] reads it, in whole units, longest first:
/// `"1h30m"`, `"500ms"`, `"0s"`.
pub(crate) fn format_window(window: Duration) -> String {
    let mut rest = window.as_nanos();
    if rest == 0 {
        return "0s".to_owned();
    }
    let mut text = String::new();
    for (unit, nanos_per_unit) in WRITTEN_UNITS {
        let count = rest / nanos_per_unit;
        if count > 0 {
            text.push_str(&count.to_string());
            text.push_str(unit);
            rest %= nanos_per_unit;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_unit_is_read() {
        let cases = [
            ("7ns", Duration::from_nanos(7)),
            ("3us", Duration::from_micros(3)),
            ("3µs", Duration::from_micros(3)),
            ("500ms", Duration::from_millis(500)),
            ("1s", Duration::from_secs(1)),
            (" 2 m ", Duration::from_secs(120)),
            ("2min", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3_600)),
            ("1d", Duration::from_secs(86_400)),
            ("1h30m", Duration::from_secs(5_400)),
            ("1h 30m 15s", Duration::from_secs(5_415)),
            ("1s500ms", Duration::from_millis(1_500)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_window(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn text_that_is_not_numbers_and_units_is_unparsable() {
        for bad in [
            "",
            " ",
            "ms",
            "1",
            "1 sec",
            "-1s",
            "1.5s",
            "1h30",
            "h1",
            "1s,2s",
            "1 fortnight",
        ] {
            assert_eq!(parse_window(bad), Err(WindowError::Unparsable), "{bad:?}");
        }
    }

    #[test]
    fn windows_past_the_maximum_are_too_long_however_far() {
        let max = Rule::MAX_WINDOW.as_nanos();
        assert_eq!(
            parse_window(&format!("{max}ns")),
            Ok(Rule::MAX_WINDOW),
            "the maximum itself is allowed"
        );
        for long in [
            format!("{}ns", max + 1),
            "106752d".to_owned(),
            "30000000d".to_owned(),
            "213503982334602d".to_owned(),
            "99999999999999999999s".to_owned(),
            "9".repeat(60) + "d",
            "106751d 23h 47m 16s 854ms 775us 809ns".to_owned(),
        ] {
            assert_eq!(parse_window(&long), Err(WindowError::TooLong), "{long}");
        }
    }

    #[test]
    fn a_written_window_reads_back_the_same() {
        let cases = [
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(5_400), "1h30m"),
            (Duration::from_nanos(1_000_001), "1ms1ns"),
            (Duration::ZERO, "0s"),
            (Rule::MAX_WINDOW, "106751d23h47m16s854ms775us808ns"),
        ];
        for (window, text) in cases {
            assert_eq!(format_window(window), text);
            assert_eq!(parse_window(text), Ok(window), "{text}");
        }
    }
}
