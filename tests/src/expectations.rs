//! Expected failures: which cases are known to fail on which backend, and why. See
//! [`Expectations`].

use std::path::Path;

use serde::{Deserialize, Serialize};
use xpu_hal::Error;

/// One expected failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    /// The backend's name (`vulkan`), or a prefix ending in `*` (`plugin*`), or `*` for
    /// every backend.
    pub backend: String,
    /// The case's name (`event.query_pending`), or a prefix ending in `*` (`cast.*`).
    pub case: String,
    /// Why it fails: a bug reference or a sentence. Reported with the result.
    pub reason: String,
}

pub(crate) fn glob_matches(pattern: &str, text: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => text.starts_with(prefix),
        None => pattern == text,
    }
}

impl Expectation {
    /// An entry from its three parts.
    pub fn new(
        backend: impl Into<String>,
        case: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Expectation {
            backend: backend.into(),
            case: case.into(),
            reason: reason.into(),
        }
    }

    /// Whether this entry covers `case` run on a device of `backend`.
    pub fn matches(&self, backend: &str, case: &str) -> bool {
        glob_matches(&self.backend, backend) && glob_matches(&self.case, case)
    }
}

/// Expected failures per backend built into the suite: `(backend, case, reason)`.
///
/// The host backend is the reference implementation and has none. A backend adds an
/// entry here only with a reason a reader can act on.
const BUILTIN: &[(&str, &str, &str)] = &[];

/// A list of expected failures. Cheap to clone; the first matching entry wins.
///
/// An expectation turns a failure into `xfail` (the run still succeeds) and a pass into
/// `xpass` (the run fails, so that a fixed bug cannot hide behind a stale entry). A skip
/// stays a skip whatever the expectations say: "unsupported" and "expected to fail" are
/// kept apart, each with its own reason.
///
/// Entries come from a built-in list per backend ([`Expectations::builtin`]) and from
/// JSON files a qualifier passes ([`Expectations::from_json_file`]), merged with
/// [`Expectations::merge`]. The file format is either a list of entries or an object
/// with an `expectations` list; `backend` and `case` may end in `*` to match a prefix:
///
/// ```json
/// { "expectations": [
///     { "backend": "vulkan", "case": "event.elapsed", "reason": "lavapipe timestamps tick in 1 ms steps" },
///     { "backend": "plugin*", "case": "cast.*", "reason": "casts land in firmware 2.1" }
/// ] }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectations {
    /// The entries, in the order they were added.
    pub entries: Vec<Expectation>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ExpectationsFile {
    List(Vec<Expectation>),
    Object { expectations: Vec<Expectation> },
}

impl Expectations {
    /// No expected failures.
    pub fn none() -> Self {
        Expectations::default()
    }

    /// The suite's built-in list for every backend.
    pub fn builtin() -> Self {
        Expectations {
            entries: BUILTIN
                .iter()
                .map(|(backend, case, reason)| Expectation::new(*backend, *case, *reason))
                .collect(),
        }
    }

    /// The built-in entries that apply to `backend`.
    pub fn builtin_for(backend: &str) -> Self {
        let mut all = Expectations::builtin();
        all.entries.retain(|e| glob_matches(&e.backend, backend));
        all
    }

    /// Parses the JSON format described in the module docs.
    pub fn from_json_str(text: &str) -> Result<Self, Error> {
        let file: ExpectationsFile = serde_json::from_str(text).map_err(|e| {
            Error::invalid(format!(
                "expectations are not valid: {e}; write a list of {{\"backend\", \"case\", \"reason\"}} objects, or an object with an \"expectations\" list"
            ))
        })?;
        let entries = match file {
            ExpectationsFile::List(entries)
            | ExpectationsFile::Object {
                expectations: entries,
            } => entries,
        };
        for e in &entries {
            if e.backend.is_empty() || e.case.is_empty() || e.reason.trim().is_empty() {
                return Err(Error::invalid(format!(
                    "expectation {{backend: `{}`, case: `{}`}} has an empty field; every entry needs a backend, a case and a reason",
                    e.backend, e.case
                )));
            }
        }
        Ok(Expectations { entries })
    }

    /// Reads and parses a JSON file in the format described in the module docs.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid(format!(
                "cannot read expectations file {}: {e}",
                path.display()
            ))
        })?;
        Expectations::from_json_str(&text)
            .map_err(|e| Error::invalid(format!("{}: {e}", path.display())))
    }

    /// Appends `other`'s entries after this list's.
    pub fn merge(&mut self, other: Expectations) -> &mut Self {
        self.entries.extend(other.entries);
        self
    }

    /// Adds one entry.
    pub fn push(&mut self, entry: Expectation) -> &mut Self {
        self.entries.push(entry);
        self
    }

    /// The first entry covering `case` on `backend`.
    pub fn lookup(&self, backend: &str, case: &str) -> Option<&Expectation> {
        self.entries.iter().find(|e| e.matches(backend, case))
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let e = Expectation::new("plugin*", "cast.*", "r");
        assert!(e.matches("plugin.simnpu", "cast.all_pairs"));
        assert!(!e.matches("host", "cast.all_pairs"));
        assert!(!e.matches("plugin.simnpu", "copy.overlap"));
        let exact = Expectation::new("host", "copy.overlap", "r");
        assert!(exact.matches("host", "copy.overlap"));
        assert!(!exact.matches("hostx", "copy.overlap"));
        assert!(!exact.matches("host", "copy.overlap2"));
        assert!(Expectation::new("*", "*", "r").matches("vulkan", "x.y"));
    }

    #[test]
    fn parse_both_forms() {
        let list = r#"[{"backend":"host","case":"a.b","reason":"why"}]"#;
        let obj = r#"{"expectations":[{"backend":"host","case":"a.b","reason":"why"}]}"#;
        assert_eq!(
            Expectations::from_json_str(list).unwrap(),
            Expectations::from_json_str(obj).unwrap()
        );
        assert!(Expectations::from_json_str(r#"[{"backend":"host","case":"a.b"}]"#).is_err());
        assert!(
            Expectations::from_json_str(r#"[{"backend":"host","case":"a.b","reason":" "}]"#)
                .is_err()
        );
    }

    #[test]
    fn host_has_no_builtin_expectations() {
        assert!(Expectations::builtin_for("host").is_empty());
    }
}
