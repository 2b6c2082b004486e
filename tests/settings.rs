//! Services from settings: a valid file behaves as a service built in code, settings sit inside a
//! program's own configuration, and every kind of mistake is an error naming the plan, the
//! limit's position and the field.
#![cfg(feature = "settings")]

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate::{
    Algorithm, FakeClock, PlanError, RateLimiterService, Rule, RuleError, Settings, SettingsError,
};

const EXAMPLE_TOML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.toml");
const EXAMPLE_JSON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/settings/plans.json");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Free,
    Pro,
}

fn toml_error(text: &str) -> SettingsError {
    Settings::from_toml_str(text).unwrap_err()
}

fn json_error(text: &str) -> SettingsError {
    Settings::from_json_str(text).unwrap_err()
}

/// A TOML file with the method and one plan, `free`, whose table is `plan`.
fn free_plan(plan: &str) -> String {
    format!("algorithm = \"token_bucket\"\n[plans.free]\n{plan}")
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
            ("free", &[Rule::per_second(5).unwrap()][..]),
            ("pro", &[Rule::per_second(50).unwrap()][..])
        ]
    );
    assert_eq!(toml.rule("pro").unwrap(), Rule::per_second(50).unwrap());
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

/// A program's own configuration, with tollgate's settings as one of its fields.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Config {
    listen: String,
    rate_limits: Settings,
}

#[test]
fn settings_sit_inside_a_programs_own_config() {
    let from_toml: Config = toml::from_str(
        r#"
        listen = "0.0.0.0:8080"
        [rate_limits]
        algorithm = "fixed_window"
        [rate_limits.plans.free]
        limit = 100
        window = "1m"
        "#,
    )
    .unwrap();
    let from_json: Config = serde_json::from_str(
        r#"{"listen": "0.0.0.0:8080",
            "rate_limits": {"algorithm": "fixed_window",
                            "plans": {"free": {"limit": 100, "window": "60s"}}}}"#,
    )
    .unwrap();
    assert_eq!(from_toml.listen, "0.0.0.0:8080");
    assert_eq!(from_toml.rate_limits, from_json.rate_limits);
    assert_eq!(
        from_toml.rate_limits.rule("free").unwrap(),
        Rule::per_minute(100).unwrap()
    );
    let service = from_toml
        .rate_limits
        .build_service::<u64, _>(FakeClock::new())
        .unwrap();
    assert_eq!(service.rule(&"free".to_owned()), Rule::per_minute(100).ok());

    // A mistake inside the program's configuration is the format's error, with the same words
    // (and, from the format, where it is).
    let error = toml::from_str::<Config>(
        "listen = \"x\"\n[rate_limits]\nalgorithm = \"fixed_window\"\n\
         [rate_limits.plans.free]\nlimit = -5\nwindow = \"1s\"",
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains(
            "plan \"free\": field \"limit\" is -5: expected a whole number of requests, at least 1"
        ),
        "{error}"
    );
    assert!(error.contains("line 5"), "{error}");
    let error = serde_json::from_str::<Config>(
        r#"{"listen": "x", "rate_limits": {"algorithm": "fixed_window",
            "plans": {"free": {"limit": 5, "window": "1s", "limit": 6}}}}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("plan \"free\": field \"limit\" is given twice"),
        "{error}"
    );
}

#[test]
fn rules_and_methods_read_on_their_own() {
    let rule: Rule = toml::from_str("limit = 10\nwindow = \"1h30m\"").unwrap();
    assert_eq!(rule, Rule::new(10, Duration::from_secs(5_400)).unwrap());
    let rule: Rule = serde_json::from_str(r#"{"window": "500ms", "limit": 3}"#).unwrap();
    assert_eq!(rule, Rule::new(3, Duration::from_millis(500)).unwrap());

    let zero = serde_json::from_str::<Rule>(r#"{"limit": 0, "window": "1s"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        zero.starts_with("field \"limit\" is 0: expected a whole number of requests, at least 1"),
        "{zero}"
    );
    let zero_window = serde_json::from_str::<Rule>(r#"{"limit": 1, "window": "0s"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        zero_window.starts_with(&RuleError::ZeroWindow.to_string()),
        "{zero_window}"
    );
    let unknown = serde_json::from_str::<Rule>(r#"{"limit": 1, "window": "1s", "burst": 2}"#)
        .unwrap_err()
        .to_string();
    assert!(
        unknown.starts_with("field \"burst\" is unknown: expected one of limit, window"),
        "{unknown}"
    );
    let not_a_table = serde_json::from_str::<Rule>("5").unwrap_err().to_string();
    assert!(
        not_a_table.starts_with("found 5: expected a table with \"limit\" and \"window\""),
        "{not_a_table}"
    );

    for algorithm in Algorithm::ALL {
        let json = serde_json::to_string(&algorithm).unwrap();
        assert_eq!(json, format!("\"{}\"", algorithm.name()));
        assert_eq!(serde_json::from_str::<Algorithm>(&json).unwrap(), algorithm);
    }
    let unknown = serde_json::from_str::<Algorithm>("\"leaky_bucket\"")
        .unwrap_err()
        .to_string();
    assert!(
        unknown.starts_with("algorithm \"leaky_bucket\" is unknown"),
        "{unknown}"
    );
}

#[test]
fn settings_written_out_read_back_the_same() {
    let text = r#"
        algorithm = "token_bucket"
        [plans.free]
        limit = 5
        window = "90m"
        [plans.pro]
        limits = [{ limit = 10, window = "1s" }, { limit = 1000, window = "1h" }]
    "#;
    let settings = Settings::from_toml_str(text).unwrap();
    let toml = toml::to_string(&settings).unwrap();
    assert!(toml.contains("window = \"1h30m\""), "{toml}");
    assert_eq!(Settings::from_toml_str(&toml).unwrap(), settings);
    let json = serde_json::to_string(&settings).unwrap();
    assert_eq!(Settings::from_json_str(&json).unwrap(), settings);
    assert_eq!(
        json,
        r#"{"algorithm":"token_bucket","plans":{"free":{"limit":5,"window":"1h30m"},"pro":{"limits":[{"limit":10,"window":"1s"},{"limit":1000,"window":"1h"}]}}}"#
    );
}

#[test]
fn an_unknown_algorithm_is_named() {
    let error = toml_error(
        r#"algorithm = "leaky_bucket"
           [plans.free]
           limit = 5
           window = "1s""#,
    );
    assert!(matches!(
        &error,
        SettingsError::InvalidField {
            plan: None,
            field: "algorithm",
            ..
        }
    ));
    assert_eq!(
        error.to_string(),
        "field \"algorithm\" is \"leaky_bucket\": expected one of \"token_bucket\", \
         \"fixed_window\", \"sliding_window_log\", \"sliding_window_counter\""
    );
}

#[test]
fn a_zero_negative_or_fractional_limit_names_the_plan_and_field() {
    for (limit, found) in [
        ("0", "0"),
        ("-5", "-5"),
        ("2.5", "2.5"),
        ("1e3", "1000.0"),
        ("\"ten\"", "\"ten\""),
        ("true", "true"),
        ("[5]", "a list"),
    ] {
        let error = toml_error(&free_plan(&format!("limit = {limit}\nwindow = \"1s\"")));
        assert_eq!(
            error,
            SettingsError::InvalidField {
                plan: Some("free".into()),
                index: None,
                field: "limit",
                found: found.into(),
                expected: "a whole number of requests, at least 1".into(),
            },
            "{limit}"
        );
    }
    assert_eq!(
        toml_error(&free_plan("limit = -5\nwindow = \"1s\"")).to_string(),
        "plan \"free\": field \"limit\" is -5: expected a whole number of requests, at least 1"
    );
}

#[test]
fn toml_nan_and_inf_are_reported_as_written() {
    for value in ["nan", "+nan", "-nan", "inf", "+inf", "-inf"] {
        let error = toml_error(&free_plan(&format!("limit = {value}\nwindow = \"1s\"")));
        let written = value.trim_start_matches('+');
        let written = if written == "-nan" { "nan" } else { written };
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("plan \"free\": field \"limit\" is {written}: ")),
            "{value}: {message}"
        );
        assert!(!message.contains("null"), "{message}");
    }
}

#[test]
fn a_toml_datetime_is_reported_as_a_datetime() {
    let error = toml_error(&free_plan("limit = 5\nwindow = 1979-05-27T07:32:00Z"));
    assert_eq!(
        error.to_string(),
        "plan \"free\": field \"window\" is the datetime 1979-05-27T07:32:00Z: expected a whole \
         number and a unit (ns, us, ms, s, m, h, d), like \"500ms\", \"1s\" or \"1h30m\""
    );
    let plan = toml_error("algorithm = \"token_bucket\"\nplans.free = 07:32:00");
    assert!(
        plan.to_string()
            .starts_with("plan \"free\": found the datetime 07:32:00: expected a table"),
        "{plan}"
    );
    let algorithm = toml_error("algorithm = 1979-05-27\n[plans.free]\nlimit = 5\nwindow = \"1s\"");
    assert!(!algorithm.to_string().contains("$__"), "{algorithm}");
    assert!(
        algorithm.to_string().contains("the datetime 1979-05-27"),
        "{algorithm}"
    );
}

#[test]
fn an_unparsable_window_names_the_plan_and_field() {
    for window in [
        "\"1 fortnight\"",
        "\"1.5s\"",
        "\"s\"",
        "1000",
        "\"\"",
        "\"-1s\"",
        "\"1h30\"",
    ] {
        let error = toml_error(&format!(
            "algorithm = \"fixed_window\"\n[plans.pro]\nlimit = 5\nwindow = {window}"
        ));
        assert!(
            matches!(&error, SettingsError::InvalidField { plan: Some(plan), index: None, field: "window", .. }
                if plan == "pro"),
            "{window}: {error:?}"
        );
        assert!(error.to_string().contains("like \"500ms\""), "{error}");
    }
}

#[test]
fn an_overflowing_window_is_too_long_not_unparsable() {
    for window in [
        "213503982334602d",
        "30000000d",
        "99999999999999999999s",
        "106752d",
    ] {
        let error = toml_error(&free_plan(&format!("limit = 5\nwindow = \"{window}\"")));
        assert_eq!(
            error,
            SettingsError::WindowTooLong {
                plan: Some("free".into()),
                index: None,
                found: format!("\"{window}\""),
                max: Rule::MAX_WINDOW,
            }
        );
        assert_eq!(
            error.to_string(),
            format!(
                "plan \"free\": field \"window\" is \"{window}\": too long, a window is at most \
                 106751d23h47m16s854ms775us808ns ({:?})",
                Rule::MAX_WINDOW
            )
        );
    }
    // The maximum itself is a window (which a method may still refuse).
    let longest: Rule =
        serde_json::from_str(r#"{"limit": 1, "window": "106751d23h47m16s854ms775us808ns"}"#)
            .unwrap();
    assert_eq!(longest.window(), Rule::MAX_WINDOW);
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
        ("1h30m", Duration::from_secs(5_400)),
        ("1h 30m", Duration::from_secs(5_400)),
    ];
    for (text, expected) in cases {
        let settings =
            Settings::from_toml_str(&free_plan(&format!("limit = 1\nwindow = \"{text}\"")))
                .unwrap();
        assert_eq!(settings.rule("free").unwrap().window(), expected, "{text}");
    }
}

#[test]
fn a_rule_the_method_cannot_honour_names_the_plan() {
    let error = json_error(
        r#"{"plans": {"bulk": {"limit": 1000000, "window": "1h"}},
            "algorithm": "sliding_window_log"}"#,
    );
    assert_eq!(
        error,
        SettingsError::Plan(PlanError::InvalidRule {
            plan: "\"bulk\"".into(),
            position: None,
            source: RuleError::LimitTooLarge {
                algorithm: Algorithm::SlidingWindowLog,
                limit: 1_000_000,
                max: 65_536
            }
        })
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
            plan: Some("x".into()),
            index: None,
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
            index: None,
            field: "plans"
        }
    );
    assert_eq!(
        toml_error("algorithm = \"token_bucket\"\n[plans]"),
        SettingsError::Plan(PlanError::NoPlans)
    );
    assert_eq!(
        toml_error("[plans.free]\nlimit = 5\nwindow = \"1s\""),
        SettingsError::MissingField {
            plan: None,
            index: None,
            field: "algorithm"
        }
    );
    assert_eq!(
        toml_error(&free_plan("window = \"1s\"")),
        SettingsError::MissingField {
            plan: Some("free".into()),
            index: None,
            field: "limit"
        }
    );
    assert_eq!(
        toml_error(&free_plan("limit = 5")).to_string(),
        "plan \"free\": field \"window\" is missing"
    );
    assert_eq!(
        json_error(r#"{"algorithm": "token_bucket", "plans": 5}"#).to_string(),
        "field \"plans\" is 5: expected a table of plans, each with a limit and a window"
    );
    assert_eq!(
        json_error("[]").to_string(),
        "found a list: expected a table with \"algorithm\" and \"plans\""
    );
}

#[test]
fn a_plan_the_program_lacks_or_does_not_know_is_named() {
    let settings = Settings::from_toml_str(&free_plan("limit = 5\nwindow = \"1s\"")).unwrap();
    let missing = settings
        .build_service_with_plans::<u64, _, _>(
            FakeClock::new(),
            [("free", Tier::Free), ("pro", Tier::Pro)],
        )
        .unwrap_err();
    assert_eq!(missing, SettingsError::MissingPlan { plan: "pro".into() });
    assert_eq!(
        settings.rule("pro").unwrap_err(),
        SettingsError::MissingPlan { plan: "pro".into() }
    );
    let unexpected = settings
        .build_service_with_plans::<u64, _, _>(FakeClock::new(), [("pro", Tier::Pro)])
        .unwrap_err();
    assert_eq!(
        unexpected,
        SettingsError::UnexpectedPlan {
            plan: "free".into()
        }
    );
    let same_value = Settings::from_toml_str(
        "algorithm = \"token_bucket\"\n[plans.free]\nlimit = 5\nwindow = \"1s\"\n\
         [plans.trial]\nlimit = 1\nwindow = \"1s\"",
    )
    .unwrap()
    .build_service_with_plans::<u64, _, _>(
        FakeClock::new(),
        [("free", Tier::Free), ("trial", Tier::Free)],
    )
    .unwrap_err();
    assert!(
        matches!(
            same_value,
            SettingsError::Plan(PlanError::DuplicatePlan { .. })
        ),
        "{same_value:?}"
    );
}

#[test]
fn a_plan_listed_twice_by_the_program_is_named_as_such() {
    let settings = Settings::from_toml_str(
        "algorithm = \"token_bucket\"\n[plans.free]\nlimit = 5\nwindow = \"1s\"\n\
         [plans.pro]\nlimit = 50\nwindow = \"1s\"",
    )
    .unwrap();
    for plans in [
        [
            ("free", Tier::Free),
            ("free", Tier::Pro),
            ("pro", Tier::Pro),
        ],
        [
            ("free", Tier::Free),
            ("pro", Tier::Pro),
            ("free", Tier::Free),
        ],
    ] {
        let error = settings
            .build_service_with_plans::<u64, _, _>(FakeClock::new(), plans)
            .unwrap_err();
        assert_eq!(
            error,
            SettingsError::PlanListedTwice {
                plan: "free".into()
            }
        );
        assert_eq!(
            error.to_string(),
            "plan \"free\" is listed twice in the program's plans"
        );
    }
}

#[test]
fn a_misspelt_field_is_named() {
    let error = toml_error(&free_plan("limt = 5\nwindow = \"1s\""));
    assert_eq!(
        error,
        SettingsError::UnknownField {
            plan: Some("free".into()),
            index: None,
            field: "limt".into(),
            expected: "limit, window, limits",
        }
    );
    assert_eq!(
        error.to_string(),
        "plan \"free\": field \"limt\" is unknown: expected one of limit, window, limits"
    );
    assert_eq!(
        toml_error("algoritm = \"token_bucket\"\n[plans.free]\nlimit = 5\nwindow = \"1s\"")
            .to_string(),
        "field \"algoritm\" is unknown: expected one of algorithm, plans"
    );
    assert_eq!(
        toml_error(&free_plan(
            "limits = [{ limit = 5, window = \"1s\" }, { limit = 5, windw = \"1s\" }]"
        ))
        .to_string(),
        "plan \"free\": limits[1]: field \"windw\" is unknown: expected one of limit, window"
    );
}

#[test]
fn a_key_repeated_in_json_is_refused_as_in_toml() {
    let plan = json_error(
        r#"{"algorithm": "token_bucket", "plans": {
            "free": {"limit": 5, "window": "1s"},
            "free": {"limit": 500, "window": "1s"}}}"#,
    );
    assert_eq!(
        plan,
        SettingsError::Plan(PlanError::DuplicatePlan {
            plan: "\"free\"".into()
        })
    );
    assert_eq!(
        plan.to_string(),
        "plan \"free\" is given twice: give each plan once"
    );
    let limit = json_error(
        r#"{"algorithm": "token_bucket",
            "plans": {"free": {"limit": 5, "window": "1s", "limit": 500}}}"#,
    );
    assert_eq!(
        limit,
        SettingsError::DuplicateField {
            plan: Some("free".into()),
            index: None,
            field: "limit".into()
        }
    );
    let algorithm = json_error(
        r#"{"algorithm": "token_bucket", "algorithm": "fixed_window",
            "plans": {"free": {"limit": 5, "window": "1s"}}}"#,
    );
    assert_eq!(
        algorithm.to_string(),
        "field \"algorithm\" is given twice: give each field once"
    );
    let plans = json_error(
        r#"{"algorithm": "token_bucket", "plans": {"free": {"limit": 5, "window": "1s"}},
            "plans": {"pro": {"limit": 5, "window": "1s"}}}"#,
    );
    assert!(
        matches!(&plans, SettingsError::DuplicateField { plan: None, field, .. } if field == "plans")
    );
    let window_in_list = json_error(
        r#"{"algorithm": "token_bucket", "plans": {"free": {"limits": [
            {"limit": 5, "window": "1s"}, {"limit": 5, "window": "1s", "window": "1h"}]}}}"#,
    );
    assert_eq!(
        window_in_list.to_string(),
        "plan \"free\": limits[1]: field \"window\" is given twice: give each field once"
    );

    // TOML refuses the same as a syntax error.
    let toml = toml_error(
        "algorithm = \"token_bucket\"\n[plans.free]\nlimit = 5\nwindow = \"1s\"\nlimit = 500",
    );
    assert!(
        matches!(toml, SettingsError::Syntax { format: "TOML", .. }),
        "{toml:?}"
    );
}

#[test]
fn a_plan_may_list_several_limits() {
    let settings = Settings::from_toml_str(
        r#"
        algorithm = "token_bucket"
        [plans.free]
        limit = 5
        window = "1s"
        [plans.pro]
        limits = [{ limit = 10, window = "1s" }, { limit = 1000, window = "1h" }]
        [plans.team]
        limits = [{ limit = 20, window = "1s" }]
        "#,
    )
    .unwrap();
    let plans: Vec<_> = settings.plans().collect();
    assert_eq!(
        plans,
        [
            ("free", &[Rule::per_second(5).unwrap()][..]),
            (
                "pro",
                &[Rule::per_second(10).unwrap(), Rule::per_hour(1000).unwrap()][..]
            ),
            ("team", &[Rule::per_second(20).unwrap()][..]),
        ]
    );
    assert_eq!(
        settings.rule("team").unwrap(),
        Rule::per_second(20).unwrap()
    );
    assert_eq!(
        settings.rule("pro").unwrap_err(),
        SettingsError::SeveralLimits {
            plan: "pro".into(),
            count: 2
        }
    );
    let json = Settings::from_json_str(
        r#"{"algorithm": "token_bucket", "plans": {
            "free": {"limit": 5, "window": "1s"},
            "pro": {"limits": [{"limit": 10, "window": "1s"}, {"limit": 1000, "window": "1h"}]},
            "team": {"limits": [{"limit": 20, "window": "1s"}]}}}"#,
    )
    .unwrap();
    assert_eq!(json, settings);
}

#[test]
fn a_service_refuses_a_plan_with_several_limits_naming_it() {
    // The sliding window log cannot give a claimed slot back, so it takes one limit per plan.
    let settings = Settings::from_toml_str(
        r#"
        algorithm = "sliding_window_log"
        [plans.free]
        limit = 5
        window = "1s"
        [plans.pro]
        limits = [{ limit = 10, window = "1s" }, { limit = 1000, window = "1h" }]
        "#,
    )
    .unwrap();
    let error = settings
        .build_service::<u64, _>(FakeClock::new())
        .unwrap_err();
    assert!(
        matches!(&error, SettingsError::Plan(PlanError::SeveralLimitsUnsupported { plan, .. }) if plan == "\"pro\""),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .starts_with("plan \"pro\" has several limits"),
        "{error}"
    );
    assert_eq!(
        settings.rule("pro").unwrap_err(),
        SettingsError::SeveralLimits {
            plan: "pro".into(),
            count: 2
        }
    );
}

#[test]
fn a_plan_with_several_limits_is_enforced_with_all_of_them() {
    let settings = Settings::from_toml_str(
        r#"
        algorithm = "fixed_window"
        [plans.free]
        limit = 5
        window = "1s"
        [plans.pro]
        limits = [{ limit = 3, window = "1s" }, { limit = 5, window = "10s" }]
        "#,
    )
    .unwrap();
    let clock = FakeClock::new();
    let service = settings
        .build_service_with_plans::<u64, _, _>(
            clock.clone(),
            [("free", Tier::Free), ("pro", Tier::Pro)],
        )
        .unwrap();
    assert_eq!(
        service.limits(&Tier::Pro).unwrap(),
        [
            Rule::per_second(3).unwrap(),
            Rule::new(5, Duration::from_secs(10)).unwrap()
        ]
    );
    let first = (0..10)
        .filter(|_| service.allow(&1, &Tier::Pro).unwrap())
        .count();
    clock.advance(Duration::from_secs(1));
    let second = (0..10)
        .filter(|_| service.allow(&1, &Tier::Pro).unwrap())
        .count();
    assert_eq!((first, second), (3, 2));
}

#[test]
fn a_mistake_in_a_list_of_limits_names_its_position() {
    let window = toml_error(&free_plan(
        "limits = [{ limit = 10, window = \"1s\" }, { limit = 1000, window = \"1 fortnight\" }]",
    ));
    assert!(
        matches!(&window, SettingsError::InvalidField { plan: Some(plan), index: Some(1), field: "window", .. }
            if plan == "free"),
        "{window:?}"
    );
    assert!(
        window
            .to_string()
            .starts_with("plan \"free\": limits[1]: field \"window\" is \"1 fortnight\": expected"),
        "{window}"
    );
    assert_eq!(
        toml_error(&free_plan("limits = [{ window = \"1s\" }]")).to_string(),
        "plan \"free\": limits[0]: field \"limit\" is missing"
    );
    assert_eq!(
        toml_error(&free_plan("limits = [{ limit = 1, window = \"1s\" }, 5]")).to_string(),
        "plan \"free\": limits[1]: found 5: expected a table with \"limit\" and \"window\""
    );
    let too_large = json_error(
        r#"{"algorithm": "sliding_window_log", "plans": {"bulk": {"limits": [
            {"limit": 10, "window": "1s"}, {"limit": 1000000, "window": "1h"}]}}}"#,
    );
    assert!(
        matches!(
            too_large,
            SettingsError::Plan(PlanError::InvalidRule {
                position: Some(1),
                source: RuleError::LimitTooLarge { .. },
                ..
            })
        ),
        "{too_large:?}"
    );
    assert!(
        too_large
            .to_string()
            .starts_with("plan \"bulk\": limits[1]: limit 1000000 is too large")
    );
}

#[test]
fn a_plan_with_both_forms_or_an_empty_list_is_refused() {
    let both = toml_error(&free_plan(
        "limit = 5\nwindow = \"1s\"\nlimits = [{ limit = 10, window = \"1s\" }]",
    ));
    assert_eq!(
        both,
        SettingsError::BothForms {
            plan: "free".into()
        }
    );
    assert!(
        both.to_string()
            .starts_with("plan \"free\" has both \"limit\"/\"window\" and \"limits\": give either")
    );
    let window_only = toml_error(&free_plan(
        "window = \"1s\"\nlimits = [{ limit = 10, window = \"1s\" }]",
    ));
    assert_eq!(window_only, both);
    let empty = toml_error(&free_plan("limits = []"));
    assert_eq!(
        empty.to_string(),
        "plan \"free\": field \"limits\" is an empty list: expected a list of at least one \
         limit, like [{ limit = 10, window = \"1s\" }]"
    );
    let not_a_list = toml_error(&free_plan("limits = { limit = 10, window = \"1s\" }"));
    assert!(
        matches!(&not_a_list, SettingsError::InvalidField { field: "limits", found, .. } if found == "a table"),
        "{not_a_list:?}"
    );
}

#[test]
fn a_syntax_error_says_where() {
    let error = toml_error("algorithm = \"token_bucket\n[plans.free]");
    assert!(matches!(
        error,
        SettingsError::Syntax { format: "TOML", .. }
    ));
    assert!(error.to_string().contains("line"), "{error}");
    let json = json_error("{\"algorithm\": }");
    assert!(json.to_string().contains("column"), "{json}");
    let trailing = json_error(
        r#"{"algorithm": "token_bucket", "plans": {"free": {"limit": 5, "window": "1s"}}} x"#,
    );
    assert!(
        matches!(trailing, SettingsError::Syntax { format: "JSON", .. }),
        "{trailing:?}"
    );
    let io = Settings::from_path("/nonexistent/tollgate.toml").unwrap_err();
    assert!(matches!(io, SettingsError::Io { .. }));
}

proptest::proptest! {
    /// Any rule written out (its window in whole units) reads back as the same rule.
    #[test]
    fn any_rule_written_out_reads_back_the_same(
        limit in 1..=u64::MAX,
        window_nanos in 1..=Rule::MAX_WINDOW.as_nanos() as u64,
    ) {
        let rule = Rule::new(limit, Duration::from_nanos(window_nanos)).unwrap();
        let json = serde_json::to_string(&rule).unwrap();
        proptest::prop_assert_eq!(serde_json::from_str::<Rule>(&json).unwrap(), rule);
        let toml = toml::to_string(&rule).unwrap();
        proptest::prop_assert_eq!(toml::from_str::<Rule>(&toml).unwrap(), rule);
    }
}
