//! Counting a client's grants: asking until one is denied.

/// Asks `allow` until it denies, at most `up_to + 1` times; how many it granted (a client
/// granted past a limit of `up_to` shows as `up_to + 1`).
pub(crate) fn grants_until_denied(up_to: u64, mut allow: impl FnMut() -> bool) -> u64 {
    let mut granted = 0;
    while granted <= up_to && allow() {
        granted += 1;
    }
    granted
}
