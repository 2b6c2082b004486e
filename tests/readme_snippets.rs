//! What the README and the rustdoc show a reader is what the crate does: every settings snippet
//! (a ```toml block) loads and builds a service, and the examples report a mistake in the words
//! the README quotes, not in a `Debug` dump.
#![cfg(feature = "settings")]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use tollgate::{FakeClock, Settings};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The message the README quotes for a negative limit.
const NEGATIVE_LIMIT_MESSAGE: &str =
    r#"plan "free": field "limit" is -5: expected a whole number of requests, at least 1"#;

/// The ```toml blocks of `text`, each with the line it starts on; `prefix` is what starts each
/// line of the text that holds them ("" for Markdown, "///" or "//!" for rustdoc).
fn toml_blocks(text: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        let Some(line) = line.trim_start().strip_prefix(prefix) else {
            continue;
        };
        // A rustdoc line is `/// text`; Markdown may indent a block inside a list.
        let content = line.strip_prefix(' ').unwrap_or(line);
        let fence = content.trim_start();
        match open.take() {
            None if fence == "```toml" => open = Some((number + 1, String::new())),
            None => {}
            Some(block) if fence == "```" => blocks.push(block),
            Some((start, mut body)) => {
                // Markdown's list indentation is not part of the TOML.
                body += content.strip_prefix("  ").unwrap_or(content);
                body.push('\n');
                open = Some((start, body));
            }
        }
    }
    assert!(open.is_none(), "an unclosed ```toml block");
    blocks
}

/// A program's own configuration holding tollgate's settings, as the README's second snippet
/// describes it (`struct Config { listen: String, rate_limits: tollgate::Settings }`).
#[derive(Deserialize)]
#[allow(dead_code)] // `listen` is read to check that the snippet has it.
struct Config {
    listen: String,
    rate_limits: Settings,
}

/// Loads one snippet (settings alone, or inside a program's configuration when it has a
/// `[rate_limits]` table) and builds the service it describes, or says why it cannot.
fn load_and_build(snippet: &str) -> Result<Settings, String> {
    let settings = if snippet.contains("[rate_limits]") {
        toml::from_str::<Config>(snippet)
            .map_err(|error| error.to_string())?
            .rate_limits
    } else {
        Settings::from_toml_str(snippet).map_err(|error| error.to_string())?
    };
    settings
        .build_service::<String, _>(FakeClock::new())
        .map_err(|error| error.to_string())?;
    Ok(settings)
}

/// Every ```toml block of `file` (relative to the crate's root), loaded and built; the number
/// of blocks found.
fn check_snippets_of(file: &str, prefix: &str) -> usize {
    let text = std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap();
    let blocks = toml_blocks(&text, prefix);
    for (line, block) in &blocks {
        if let Err(error) = load_and_build(block) {
            panic!("{file}:{line}: the settings snippet does not work: {error}\n{block}");
        }
    }
    blocks.len()
}

#[test]
fn every_settings_snippet_of_the_readme_loads_and_builds_a_service() {
    // The settings file, and the same settings inside a program's configuration.
    assert_eq!(check_snippets_of("README.md", ""), 2);
}

#[test]
fn every_settings_snippet_of_the_rustdoc_loads_and_builds_a_service() {
    let mut files = vec![PathBuf::from("src")];
    let mut found = 0;
    while let Some(path) = files.pop() {
        let absolute = Path::new(ROOT).join(&path);
        if absolute.is_dir() {
            for entry in std::fs::read_dir(&absolute).unwrap() {
                files.push(path.join(entry.unwrap().file_name()));
            }
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            let file = path.to_str().unwrap();
            found += check_snippets_of(file, "///") + check_snippets_of(file, "//!");
        }
    }
    // `Settings`'s own docs show the format.
    assert!(found >= 1, "no ```toml block found in the rustdoc");
}

#[test]
fn the_snippet_reader_finds_a_plan_the_method_cannot_enforce() {
    // The README's settings example once paired the sliding log with a plan of two limits.
    let snippet = "algorithm = \"sliding_window_log\"\n[plans.pro]\n\
                   limits = [{ limit = 50, window = \"1s\" }, { limit = 10000, window = \"1h\" }]\n";
    let error = load_and_build(snippet).unwrap_err();
    assert!(error.contains("several limits"), "{error}");
    let markdown = format!(
        "text\n\n  ```toml\n  {}\n  ```\n",
        snippet.replace('\n', "\n  ")
    );
    assert_eq!(toml_blocks(&markdown, "").len(), 1);
}

#[test]
fn the_readme_quotes_the_settings_message_for_a_negative_limit() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    assert!(
        readme.contains(NEGATIVE_LIMIT_MESSAGE),
        "the README no longer quotes {NEGATIVE_LIMIT_MESSAGE:?}"
    );
    let error = Settings::from_toml_str(
        "algorithm = \"token_bucket\"\n[plans.free]\nlimit = -5\nwindow = \"1s\"\n",
    )
    .unwrap_err();
    assert_eq!(error.to_string(), NEGATIVE_LIMIT_MESSAGE);
}

/// The `settings` example, built with the flags this test was built with (the same profile;
/// every feature when loom's is on, as under the CI's test command, where the example is then
/// already built; else the features this test has), so that the build matches the toolchain and
/// the run that asked for it.
fn settings_example() -> PathBuf {
    let test_binary = std::env::current_exe().unwrap();
    // <target>/<profile>/deps/<this test>
    let profile_dir = test_binary.parent().and_then(Path::parent).unwrap();
    let target_dir = profile_dir.parent().unwrap();
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(ROOT)
        .args(["build", "--quiet", "--example", "settings"])
        .arg("--target-dir")
        .arg(target_dir);
    if cfg!(feature = "loom") {
        build.arg("--all-features");
    } else {
        let features: Vec<&str> = [
            ("serde", cfg!(feature = "serde")),
            ("settings", cfg!(feature = "settings")),
            ("redis", cfg!(feature = "redis")),
            ("tower", cfg!(feature = "tower")),
            ("axum", cfg!(feature = "axum")),
            ("tonic", cfg!(feature = "tonic")),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
        build.arg("--features").arg(features.join(","));
    }
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        build.arg("--release");
    }
    let status = build.status().unwrap();
    assert!(status.success(), "building the settings example failed");
    profile_dir.join("examples").join("settings")
}

#[test]
fn an_example_reports_a_mistake_in_the_words_the_readme_quotes() {
    let dir = std::env::temp_dir().join(format!("tollgate-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("negative.toml");
    std::fs::write(
        &file,
        "algorithm = \"token_bucket\"\n[plans.free]\nlimit = -5\nwindow = \"1s\"\n",
    )
    .unwrap();
    let output = Command::new(settings_example())
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr, format!("error: {NEGATIVE_LIMIT_MESSAGE}\n"));
}

#[test]
fn every_rust_block_of_the_readme_is_compiled_and_none_is_compiled_out() {
    // src/lib.rs includes the README as doc tests when the features its blocks use are on; a
    // block that is `ignore`d, or whose code a hidden `#[cfg(feature = ...)]` removes, would be
    // reported as passing without being checked.
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let mut rust_blocks = 0;
    for (number, line) in readme.lines().enumerate() {
        let line = line.trim_start();
        if let Some(info) = line.strip_prefix("```rust") {
            rust_blocks += 1;
            assert!(
                !info.contains("ignore"),
                "README.md:{}: an ignored block: {line}",
                number + 1
            );
        }
        assert!(
            !(line.starts_with('#') && line.contains("cfg(feature")),
            "README.md:{}: a block compiled out by feature: {line}",
            number + 1
        );
    }
    assert!(rust_blocks >= 4, "{rust_blocks} rust blocks found");
    let lib = std::fs::read_to_string(Path::new(ROOT).join("src/lib.rs")).unwrap();
    assert!(lib.contains(
        "#[cfg(all(doctest, feature = \"redis\", feature = \"tower\"))]\n\
         #[doc = include_str!(\"../README.md\")]"
    ));
}
