//! Services from settings files: a valid file behaves as a service built in code, and every kind
//! of mistake is an error naming the plan and the field.
#![cfg(feature = "serde")]

use std::time::Duration;

use tollgate::{
    Algorithm, FakeClock, RateLimiterService, Rule, RuleError, Settings, SettingsError,
    parse_window,
};

const EXAMPLE_TOML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.toml");
const EXAMPLE_JSON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.json");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Free,
    Pro,
}

#[test]
fn the_example_files_read_the_same_in_toml_and_json() {
    let toml = Settings::from_path(EXAMPLE_TOML).unwrap();
    let json = Settings::from_path(EXAMPLE_JSON).unwrap();
    assert_eq!(toml, json);
    assert_eq!(toml.algorithm(), Algorithm::SlidingWindowLog);
    let plans: Vec<_> = toml.plans().collect();
    assert_eq!(
        plans,
        [
            ("free", Rule::per_second(5).unwrap()),
            ("pro", Rule::per_second(50).unwrap())
        ]
    );
}

#[test]
fn a_service_from_settings_behaves_like_one_built_in_code() {
    let settings = Settings::from_path(EXAMPLE_TOML).unwrap();
    let file_clock = FakeClock::new();
    let from_file = settings
        .build_service_with_plans::<u64, _, _>(
            file_clock.clone(),
            [("free", Tier::Free), ("pro", Tier::Pro)],
        )
        .unwrap();
    let code_clock = FakeClock::new();
    let in_code = RateLimiterService::<u64, Tier, _>::new(
        Algorithm::SlidingWindowLog,
        [
            (Tier::Free, Rule::per_second(5).unwrap()),
            (Tier::Pro, Rule::per_second(50).unwrap()),
        ],
        code_clock.clone(),
    )
    .unwrap();
    for step in 0..400u64 {
        let (client, tier) = (step % 3, if step % 4 == 0 { Tier::Pro } else { Tier::Free });
        let a = from_file.acquire(&client, &tier, 1).unwrap();
        let b = in_code.acquire(&client, &tier, 1).unwrap();
        assert_eq!(a, b, "step {step}");
        file_clock.advance(Duration::from_millis(step % 37));
        code_clock.advance(Duration::from_millis(step % 37));
    }
}

#[test]
fn plan_names_from_the_file_serve_as_plans() {
    let settings = Settings::from_path(EXAMPLE_JSON).unwrap();
    let service = settings
        .build_service::<String, _>(FakeClock::new())
        .unwrap();
    let free = "free".to_owned();
    assert_eq!(
        (0..10)
            .filter(|_| service.allow("alice", &free).unwrap())
            .count(),
        5
    );
}

fn toml_error(text: &str) -> SettingsError {
    Settings::from_toml_str(text).unwrap_err()
}

#[test]
fn an_unknown_algorithm_is_named() {
    let error = toml_error(
        r#"algorithm = "leaky_bucket"
           [plans.free]
           limit = 5
           window = "1s""#,
    );
    assert!(
        matches!(&error, SettingsError::InvalidField { plan: None, field, .. } if field == "algorithm")
    );
    assert_eq!(
        error.to_string(),
        "field \"algorithm\" is \"leaky_bucket\": expected one of \"token_bucket\", \
         \"fixed_window\", \"sliding_window_log\""
    );
}

#[test]
fn a_zero_or_negative_limit_names_the_plan_and_field() {
    for limit in ["0", "-5", "2.5", "\"ten\""] {
        let error = toml_error(&format!(
            "algorithm = \"token_bucket\"\n[plans.free]\nlimit = {limit}\nwindow = \"1s\""
        ));
        assert!(
            matches!(&error, SettingsError::InvalidField { plan: Some(plan), field, .. }
                if plan == "free" && field == "limit"),
            "{limit}: {error:?}"
        );
        let message = error.to_string();
        assert!(
            message.starts_with("plan \"free\": field \"limit\""),
            "{message}"
        );
        assert!(message.contains("at least 1"), "{message}");
    }
}

#[test]
fn an_unparsable_window_names_the_plan_and_field() {
    for window in ["\"1 fortnight\"", "\"1.5s\"", "\"s\"", "1000", "\"\""] {
        let error = toml_error(&format!(
            "algorithm = \"fixed_window\"\n[plans.pro]\nlimit = 5\nwindow = {window}"
        ));
        assert!(
            matches!(&error, SettingsError::InvalidField { plan: Some(plan), field, .. }
                if plan == "pro" && field == "window"),
            "{window}: {error:?}"
        );
        assert!(error.to_string().contains("like \"500ms\""));
    }
}

#[test]
fn a_rule_the_method_cannot_honour_names_the_plan() {
    let error = Settings::from_json_str(
        r#"{"algorithm": "sliding_window_log",
            "plans": {"bulk": {"limit": 1000000, "window": "1h"}}}"#,
    )
    .unwrap_err();
    assert_eq!(
        error,
        SettingsError::InvalidRule {
            plan: "bulk".into(),
            source: RuleError::LimitTooLarge {
                algorithm: Algorithm::SlidingWindowLog,
                limit: 1_000_000,
                max: 65_536
            }
        }
    );
    assert!(
        error
            .to_string()
            .starts_with("plan \"bulk\": limit 1000000")
    );

    let zero_window =
        toml_error("algorithm = \"token_bucket\"\n[plans.x]\nlimit = 1\nwindow = \"0s\"");
    assert_eq!(
        zero_window,
        SettingsError::InvalidRule {
            plan: "x".into(),
            source: RuleError::ZeroWindow
        }
    );
}

#[test]
fn missing_plans_and_fields_are_named() {
    assert_eq!(
        toml_error("algorithm = \"token_bucket\""),
        SettingsError::MissingField {
            plan: None,
            field: "plans"
        }
    );
    assert_eq!(
        toml_error("algorithm = \"token_bucket\"\n[plans]"),
        SettingsError::NoPlans
    );
    assert_eq!(
        toml_error("[plans.free]\nlimit = 5\nwindow = \"1s\""),
        SettingsError::MissingField {
            plan: None,
            field: "algorithm"
        }
    );
    assert_eq!(
        toml_error("algorithm = \"token_bucket\"\n[plans.free]\nwindow = \"1s\""),
        SettingsError::MissingField {
            plan: Some("free".into()),
            field: "limit"
        }
    );
    let missing_window = toml_error("algorithm = \"token_bucket\"\n[plans.free]\nlimit = 5");
    assert_eq!(
        missing_window.to_string(),
        "plan \"free\": field \"window\" is missing"
    );

    let settings = Settings::from_toml_str(
        "algorithm = \"token_bucket\"\n[plans.free]\nlimit = 5\nwindow = \"1s\"",
    )
    .unwrap();
    let missing = settings
        .build_service_with_plans::<u64, _, _>(
            FakeClock::new(),
            [("free", Tier::Free), ("pro", Tier::Pro)],
        )
        .unwrap_err();
    assert_eq!(missing, SettingsError::MissingPlan { plan: "pro".into() });
    let unexpected = settings
        .build_service_with_plans::<u64, _, _>(FakeClock::new(), [("pro", Tier::Pro)])
        .unwrap_err();
    assert_eq!(
        unexpected,
        SettingsError::UnexpectedPlan {
            plan: "free".into()
        }
    );
}

#[test]
fn a_misspelt_field_is_named() {
    let error = toml_error("algorithm = \"token_bucket\"\n[plans.free]\nlimt = 5\nwindow = \"1s\"");
    assert_eq!(
        error,
        SettingsError::UnknownField {
            plan: Some("free".into()),
            field: "limt".into()
        }
    );
    assert!(error.to_string().contains("expected one of limit, window"));
}

#[test]
fn a_syntax_error_says_where() {
    let error = toml_error("algorithm = \"token_bucket\n[plans.free]");
    assert!(matches!(
        error,
        SettingsError::Syntax { format: "TOML", .. }
    ));
    assert!(error.to_string().contains("line"), "{error}");
    let json = Settings::from_json_str("{\"algorithm\": }").unwrap_err();
    assert!(json.to_string().contains("column"), "{json}");
    let io = Settings::from_path("/nonexistent/tollgate.toml").unwrap_err();
    assert!(matches!(io, SettingsError::Io { .. }));
}

#[test]
fn windows_take_every_documented_unit() {
    let cases = [
        ("7ns", Duration::from_nanos(7)),
        ("3us", Duration::from_micros(3)),
        ("3µs", Duration::from_micros(3)),
        ("500ms", Duration::from_millis(500)),
        ("1s", Duration::from_secs(1)),
        ("2 m", Duration::from_secs(120)),
        ("2min", Duration::from_secs(120)),
        ("1h", Duration::from_secs(3_600)),
        ("1d", Duration::from_secs(86_400)),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_window(text), Some(expected), "{text}");
    }
    for bad in [
        "",
        "ms",
        "1",
        "1 sec",
        "-1s",
        "1.5s",
        "99999999999999999999s",
        "30000000d",
    ] {
        assert_eq!(parse_window(bad), None, "{bad}");
    }
}
