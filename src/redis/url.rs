//! Redis URLs as errors and logs may show them: with the password hidden.

/// `url` with the password, if any, replaced by `***`, fit for errors and logs.
pub(super) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    // The last `@` ends the user information, whatever the password holds (`/`, `?`, `#` and
    // `@` included, unencoded as users write them): redacting too much of a URL whose path
    // holds an `@` is harmless, showing part of a password is not.
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split_once(':').map_or("", |(user, _)| user);
    format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://:secret@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact("redis://user:secret@host:1"),
            "redis://user:***@host:1"
        );
        for password in ["pa/ss", "pa?ss", "pa#ss", "pa@ss/w", "p:a@s"] {
            assert_eq!(
                redact(&format!("redis+cluster://user:{password}@h:1,h:2/0")),
                "redis+cluster://user:***@h:1,h:2/0",
                "{password}"
            );
        }
    }
}
