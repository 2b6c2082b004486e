//! The service's configuration: envoyproxy/ratelimit's YAML, read and checked whole.
//!
//! A file holds one domain per YAML document (documents separated by `---`), or a directory
//! holds such files (`*.yaml`, `*.yml`), as envoyproxy/ratelimit keeps one file per domain:
//!
//! ```yaml
//! domain: edge
//! method: token_bucket            # tollgate: the method of every limit below (default: fixed_window)
//! descriptors:
//!   - key: remote_address         # key only: each address has its own limit
//!     rate_limit: {unit: minute, requests_per_unit: 60}
//!   - key: plan
//!     value: free                 # this value only
//!     descriptors:                # nested: a descriptor of the entries (plan, free), (user, ...)
//!       - key: user
//!         limits:                 # tollgate: several limits, all or nothing
//!           - {unit: second, requests_per_unit: 5}
//!           - {unit: hour, requests_per_unit: 1000}
//!   - key: path
//!     value: /login
//!     shadow_mode: true           # decided and counted, never refused
//!     rate_limit: {unit: second, requests_per_unit: 2, name: login}
//! ```
//!
//! Every field of envoyproxy/ratelimit's format is read: `domain`, `descriptors` (`key`,
//! `value`, `rate_limit` of `unit` (`second`, `minute`, `hour`, `day`, `week`, `month` of 30
//! days, `year` of 365 days), `requests_per_unit`, `unlimited`, `name`, `replaces`), nested
//! `descriptors`, `shadow_mode`, `detailed_metric`. A `value` ending in `*` matches every value
//! that starts with what comes before it. tollgate adds `method` (per domain or descriptor,
//! inherited by nested descriptors: `token_bucket`, `fixed_window`, `sliding_window_log`,
//! `sliding_window_counter`) and `limits` (a list of `rate_limit`-shaped limits enforced
//! together, in place of `rate_limit`; not under the sliding window log, whose claimed slots
//! cannot be given back). A field that is neither is an error, as a misspelled
//! field would otherwise be silently ignored.
//!
//! Every mistake is a [`ConfigError`] naming its place: the file, the domain and the path of
//! descriptors down to the field (`edge.yaml: domain "edge": descriptors[1] (plan=free)
//! .descriptors[0] (user): limits[1].requests_per_unit: ...`).

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::{Algorithm, Rule, RuleError};

/// A mistake in the configuration, with the place it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    place: String,
    message: String,
}

impl ConfigError {
    fn new(place: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            place: place.into(),
            message: message.into(),
        }
    }

    /// Where the mistake is: the file, then the domain and the descriptors leading to it.
    pub fn place(&self) -> &str {
        &self.place
    }

    /// What is wrong there.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A `rate_limit` unit: envoyproxy/ratelimit's, with its lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    const ALL: [(Unit, &'static str); 7] = [
        (Unit::Second, "second"),
        (Unit::Minute, "minute"),
        (Unit::Hour, "hour"),
        (Unit::Day, "day"),
        (Unit::Week, "week"),
        (Unit::Month, "month"),
        (Unit::Year, "year"),
    ];

    /// The unit's length.
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// The unit's name in the configuration.
    pub fn name(self) -> &'static str {
        Unit::ALL
            .iter()
            .find(|(unit, _)| *unit == self)
            .map_or("second", |(_, name)| name)
    }

    fn parse(text: &str) -> Option<Unit> {
        Unit::ALL
            .iter()
            .find(|(_, name)| name.eq_ignore_ascii_case(text))
            .map(|(unit, _)| *unit)
    }
}

/// One limit of a descriptor: `requests_per_unit` per `unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnitLimit {
    /// The unit.
    pub unit: Unit,
    /// Requests per unit (at least 1).
    pub requests_per_unit: u64,
}

impl UnitLimit {
    /// The limit as a tollgate rule.
    pub fn rule(&self) -> Result<Rule, RuleError> {
        Rule::new(self.requests_per_unit, self.unit.duration())
    }
}

/// What a matched descriptor gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limits {
    /// Never limited (`unlimited: true`), reported as OK.
    Unlimited,
    /// `requests_per_unit: 0`: every request over the limit, as envoyproxy/ratelimit answers.
    Blocked(Unit),
    /// One limit or several, enforced together by `method`.
    Limited {
        /// The method.
        method: Algorithm,
        /// The limits, in the configuration's order (at most
        /// [`RateLimiterService::MAX_LIMITS`](crate::RateLimiterService::MAX_LIMITS)).
        limits: Vec<UnitLimit>,
    },
}

/// A descriptor's limit as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorLimit {
    /// What is enforced.
    pub limits: Limits,
    /// The `rate_limit`'s `name`, for `replaces` and the reported policy's name.
    pub name: Option<String>,
    /// The names of the limits this one replaces when both match one request.
    pub replaces: Vec<String>,
}

/// How an entry's value is matched.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ValueMatch {
    /// No `value`: every value, each with its own limit.
    Any,
    /// This value.
    Exact(String),
    /// A `value` ending in `*`: every value starting with the text before it, each value with
    /// its own limit.
    Prefix(String),
}

/// One configured descriptor entry, and what lies below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorNode {
    /// The entry's key.
    pub key: String,
    /// Which values match.
    pub value: ValueMatch,
    /// The limit of a descriptor that ends here.
    pub limit: Option<DescriptorLimit>,
    /// Decided and counted, never refused.
    pub shadow_mode: bool,
    /// Metrics of this descriptor name its values (one series per value: for bounded values).
    pub detailed_metric: bool,
    /// Nested descriptors.
    pub children: Vec<DescriptorNode>,
    /// The path of keys and configured values from the domain down to this entry
    /// (`plan=free.user`): the policy name when the limit has none, and the metrics' label.
    /// Two descriptors may print alike (a key `a=x.b` and `b` below `a: x`).
    pub path: String,
    /// The same path written so that no two descriptors share it (each key and value with its
    /// length, and how the value matches): what names the descriptor's state, on Redis and
    /// across reloads.
    pub identity: String,
}

/// One domain's descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainConfig {
    /// The domain, as Envoy's filter names it.
    pub domain: String,
    /// The domain's method (`method:`, else the fixed window): that of its descriptors that name
    /// none, and of the limits that requests' descriptors bring (`RateLimitDescriptor.limit`).
    pub method: Algorithm,
    /// The top-level descriptors.
    pub descriptors: Vec<DescriptorNode>,
}

/// The whole configuration: every domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsConfig {
    /// The domains, each once.
    pub domains: Vec<DomainConfig>,
}

/// The most descriptors nested in one another (Envoy's actions make a handful).
const MAX_DEPTH: usize = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainFile {
    domain: Option<String>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    descriptors: Vec<DescriptorFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorFile {
    key: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimitFile>,
    #[serde(default)]
    limits: Option<Vec<RateLimitFile>>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    descriptors: Vec<DescriptorFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitFile {
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<ReplacesFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesFile {
    name: Option<String>,
}

impl RlsConfig {
    /// Reads the configuration at `path`: a YAML file of one domain per document, or a directory
    /// of such files (`*.yaml`, `*.yml`, in name order).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the file (and the place in it) that cannot be read or is wrong.
    pub fn from_path(path: impl AsRef<Path>) -> Result<RlsConfig, ConfigError> {
        let path = path.as_ref();
        let place = path.display().to_string();
        let metadata =
            std::fs::metadata(path).map_err(|error| ConfigError::new(&place, error.to_string()))?;
        let files: Vec<PathBuf> = if metadata.is_dir() {
            let mut files = Vec::new();
            let entries = std::fs::read_dir(path)
                .map_err(|error| ConfigError::new(&place, error.to_string()))?;
            for entry in entries {
                let entry = entry.map_err(|error| ConfigError::new(&place, error.to_string()))?;
                let file = entry.path();
                let is_yaml = file
                    .extension()
                    .is_some_and(|extension| extension == "yaml" || extension == "yml");
                if is_yaml && file.is_file() {
                    files.push(file);
                }
            }
            files.sort();
            if files.is_empty() {
                return Err(ConfigError::new(place, "the directory has no *.yaml file"));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };
        let mut texts = Vec::with_capacity(files.len());
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|error| ConfigError::new(file.display().to_string(), error.to_string()))?;
            texts.push((file.display().to_string(), text));
        }
        RlsConfig::from_sources(
            texts
                .iter()
                .map(|(name, text)| (name.as_str(), text.as_str())),
        )
    }

    /// Reads a configuration from YAML text (`source` names it in errors).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the place of the first mistake.
    pub fn from_yaml_str(source: &str, yaml: &str) -> Result<RlsConfig, ConfigError> {
        RlsConfig::from_sources([(source, yaml)])
    }

    fn from_sources<'a>(
        sources: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<RlsConfig, ConfigError> {
        let mut domains: Vec<DomainConfig> = Vec::new();
        let mut first_seen: Vec<String> = Vec::new();
        for (source, yaml) in sources {
            for (position, document) in serde_yaml_ng::Deserializer::from_str(yaml).enumerate() {
                let place = format!("{source}: document {}", position + 1);
                let file = match DomainFile::deserialize(document) {
                    Ok(file) => file,
                    // An empty document (a trailing `---`) holds no domain.
                    Err(error) if error.to_string().contains("EOF while parsing") => continue,
                    Err(error) => return Err(ConfigError::new(place, error.to_string())),
                };
                let domain = domain_config(source, file)?;
                if let Some(index) = domains
                    .iter()
                    .position(|known| known.domain == domain.domain)
                {
                    return Err(ConfigError::new(
                        format!("{source}: domain {:?}", domain.domain),
                        format!(
                            "the domain is configured twice (first in {})",
                            first_seen[index]
                        ),
                    ));
                }
                first_seen.push(place);
                domains.push(domain);
            }
        }
        if domains.is_empty() {
            return Err(ConfigError::new(
                "configuration",
                "no domain is configured (a document needs `domain:` and `descriptors:`)",
            ));
        }
        Ok(RlsConfig { domains })
    }
}

fn domain_config(source: &str, file: DomainFile) -> Result<DomainConfig, ConfigError> {
    let domain = match file.domain {
        Some(domain) if !domain.is_empty() => domain,
        _ => return Err(ConfigError::new(source, "`domain` is missing or empty")),
    };
    let place = format!("{source}: domain {domain:?}");
    let method = match &file.method {
        Some(name) => parse_method(name)
            .map_err(|message| ConfigError::new(format!("{place}: method"), message))?,
        None => Algorithm::FixedWindow,
    };
    let descriptors = descriptor_list(&format!("{place}: "), "", "", file.descriptors, method, 1)?;
    let mut names = HashSet::new();
    collect_names(&descriptors, &mut names);
    check_replaces(&place, &descriptors, &names)?;
    Ok(DomainConfig {
        domain,
        method,
        descriptors,
    })
}

fn parse_method(name: &str) -> Result<Algorithm, String> {
    name.parse::<Algorithm>().map_err(|error| error.to_string())
}

fn descriptor_list(
    place: &str,
    parent_path: &str,
    parent_identity: &str,
    files: Vec<DescriptorFile>,
    method: Algorithm,
    depth: usize,
) -> Result<Vec<DescriptorNode>, ConfigError> {
    if depth > MAX_DEPTH {
        return Err(ConfigError::new(
            place,
            format!("descriptors are nested more than {MAX_DEPTH} deep"),
        ));
    }
    let mut nodes: Vec<DescriptorNode> = Vec::with_capacity(files.len());
    for (index, file) in files.into_iter().enumerate() {
        let key = match &file.key {
            Some(key) if !key.is_empty() => key.clone(),
            _ => {
                return Err(ConfigError::new(
                    format!("{place}descriptors[{index}]"),
                    "`key` is missing or empty",
                ));
            }
        };
        let value = match file.value.as_deref() {
            None | Some("") => ValueMatch::Any,
            Some(value) => match value.strip_suffix('*') {
                Some(prefix) => ValueMatch::Prefix(prefix.to_owned()),
                None => ValueMatch::Exact(value.to_owned()),
            },
        };
        let segment = match &file.value {
            Some(value) if !value.is_empty() => format!("{key}={value}"),
            _ => key.clone(),
        };
        let here = format!("{place}descriptors[{index}] ({segment})");
        if let Some(twin) = nodes
            .iter()
            .position(|node| node.key == key && node.value == value)
        {
            return Err(ConfigError::new(
                here,
                format!("the same key and value as descriptors[{twin}] of this list"),
            ));
        }
        let method = match &file.method {
            Some(name) => parse_method(name)
                .map_err(|message| ConfigError::new(format!("{here}: method"), message))?,
            None => method,
        };
        let limit = descriptor_limit(&here, &file, method)?;
        let path = if parent_path.is_empty() {
            segment
        } else {
            format!("{parent_path}.{segment}")
        };
        let identity = {
            let (kind, text) = match &value {
                ValueMatch::Any => ('*', ""),
                ValueMatch::Exact(value) => ('=', value.as_str()),
                ValueMatch::Prefix(prefix) => ('^', prefix.as_str()),
            };
            format!(
                "{parent_identity}{}:{key}{kind}{}:{text}/",
                key.len(),
                text.len()
            )
        };
        let children = descriptor_list(
            &format!("{here}."),
            &path,
            &identity,
            file.descriptors,
            method,
            depth + 1,
        )?;
        nodes.push(DescriptorNode {
            key,
            value,
            limit,
            shadow_mode: file.shadow_mode,
            detailed_metric: file.detailed_metric,
            children,
            path,
            identity,
        });
    }
    Ok(nodes)
}

fn descriptor_limit(
    here: &str,
    file: &DescriptorFile,
    method: Algorithm,
) -> Result<Option<DescriptorLimit>, ConfigError> {
    let (field, blocks): (&str, Vec<&RateLimitFile>) = match (&file.rate_limit, &file.limits) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                here,
                "`rate_limit` and `limits` both given: use `limits` alone for several limits",
            ));
        }
        (Some(one), None) => ("rate_limit", vec![one]),
        (None, Some(several)) => ("limits", several.iter().collect()),
        (None, None) => return Ok(None),
    };
    if blocks.is_empty() {
        return Err(ConfigError::new(
            format!("{here}: limits"),
            "the list is empty (give at least one limit, or leave `limits` out)",
        ));
    }
    let max = crate::RateLimiterService::<String, ()>::MAX_LIMITS;
    if blocks.len() > max {
        return Err(ConfigError::new(
            format!("{here}: limits"),
            format!(
                "{} limits given, at most {max} are enforced together",
                blocks.len()
            ),
        ));
    }
    let at = |position: usize| {
        if field == "limits" {
            format!("{here}: limits[{position}]")
        } else {
            format!("{here}: rate_limit")
        }
    };
    // `name` and `replaces` are the descriptor's, whichever block carries them.
    let mut name = None;
    let mut replaces = Vec::new();
    let mut limits = Vec::with_capacity(blocks.len());
    let mut unlimited = false;
    let mut blocked = None;
    for (position, block) in blocks.iter().enumerate() {
        let place = at(position);
        if let Some(given) = &block.name {
            if given.is_empty() {
                return Err(ConfigError::new(
                    format!("{place}.name"),
                    "the name is empty",
                ));
            }
            if name.replace(given.clone()).is_some() {
                return Err(ConfigError::new(
                    format!("{place}.name"),
                    "a descriptor has one name: give it on one limit only",
                ));
            }
        }
        for (index, replaced) in block.replaces.iter().enumerate() {
            match &replaced.name {
                Some(replaced) if !replaced.is_empty() => replaces.push(replaced.clone()),
                _ => {
                    return Err(ConfigError::new(
                        format!("{place}.replaces[{index}]"),
                        "`name` is missing or empty",
                    ));
                }
            }
        }
        if block.unlimited {
            if block.unit.is_some() || block.requests_per_unit.is_some() || blocks.len() > 1 {
                return Err(ConfigError::new(
                    format!("{place}.unlimited"),
                    "an unlimited descriptor takes no `unit`, `requests_per_unit` or other limit",
                ));
            }
            unlimited = true;
            continue;
        }
        let unit_text = block.unit.as_deref().ok_or_else(|| {
            ConfigError::new(
                format!("{place}.unit"),
                "missing (second, minute, hour, day, week, month or year)",
            )
        })?;
        let unit = Unit::parse(unit_text).ok_or_else(|| {
            ConfigError::new(
                format!("{place}.unit"),
                format!(
                    "{unit_text:?} is not a unit (second, minute, hour, day, week, month or year)"
                ),
            )
        })?;
        let requests_per_unit = block
            .requests_per_unit
            .ok_or_else(|| ConfigError::new(format!("{place}.requests_per_unit"), "missing"))?;
        if requests_per_unit == 0 {
            if blocks.len() > 1 {
                return Err(ConfigError::new(
                    format!("{place}.requests_per_unit"),
                    "0 (refuse everything) cannot be one of several limits: give it alone",
                ));
            }
            blocked = Some(unit);
            continue;
        }
        if requests_per_unit > u64::from(u32::MAX) {
            return Err(ConfigError::new(
                format!("{place}.requests_per_unit"),
                format!(
                    "{requests_per_unit} is above {}, the most Envoy's answer can carry (a 32-bit field)",
                    u32::MAX
                ),
            ));
        }
        let limit = UnitLimit {
            unit,
            requests_per_unit,
        };
        limit.rule().map_err(|error| {
            ConfigError::new(format!("{place}.requests_per_unit"), error.to_string())
        })?;
        if limits.contains(&limit) {
            return Err(ConfigError::new(place, "the same limit is given twice"));
        }
        limits.push(limit);
    }
    if limits.len() > 1 && method == Algorithm::SlidingWindowLog {
        // In process a log's claimed slots cannot be given back, so several logs cannot be
        // enforced together; refused for Redis too, so that a file means the same on both.
        return Err(ConfigError::new(
            format!("{here}: limits"),
            "the sliding window log takes one limit per descriptor: give one, or use \
             token_bucket, fixed_window or sliding_window_counter for several",
        ));
    }
    let limits = if unlimited {
        Limits::Unlimited
    } else if let Some(unit) = blocked {
        Limits::Blocked(unit)
    } else {
        Limits::Limited { method, limits }
    };
    Ok(Some(DescriptorLimit {
        limits,
        name,
        replaces,
    }))
}

fn collect_names<'a>(nodes: &'a [DescriptorNode], names: &mut HashSet<&'a str>) {
    for node in nodes {
        if let Some(name) = node.limit.as_ref().and_then(|limit| limit.name.as_deref()) {
            names.insert(name);
        }
        collect_names(&node.children, names);
    }
}

fn check_replaces(
    place: &str,
    nodes: &[DescriptorNode],
    names: &HashSet<&str>,
) -> Result<(), ConfigError> {
    for node in nodes {
        if let Some(limit) = &node.limit {
            for replaced in &limit.replaces {
                if !names.contains(replaced.as_str()) {
                    return Err(ConfigError::new(
                        format!("{place}: descriptor {}: replaces", node.path),
                        format!("no limit of this domain is named {replaced:?}"),
                    ));
                }
            }
        }
        check_replaces(place, &node.children, names)?;
    }
    Ok(())
}
