//! Expected failures: which cases are known to fail on which backend, and why. See
//! [`Expectations`].

use std::path::Path;

use serde::{Deserialize, Serialize};
use xpu_hal::Error;

/// One expected failure.
///
/// Beyond the backend and the case, an entry may single out the devices it is about —
/// by `vendor`, device `name` and `driver` version — and the failure it expects, by a
/// `message` pattern the failure's message must match: then a different failure of the
/// same case, or the same failure on another driver, is still a failure. `flaky` marks
/// a case that fails only sometimes: its failure (matching the rest of the entry) is an
/// expected failure and its pass a pass, never an unexpected pass.
///
/// Every pattern matches the whole text, with `*` standing for any run of characters
/// (`2.1.*`, `*out of memory*`); a pattern without `*` must equal the text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    /// The backend's name (`vulkan`), or a pattern (`plugin*`, `*` for every backend).
    pub backend: String,
    /// The case's name (`event.query_pending`), or a pattern (`cast.*`).
    pub case: String,
    /// Why it fails: a bug reference or a sentence. Reported with the result.
    pub reason: String,
    /// A pattern the device's vendor must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// A pattern the device's name must match (`llvmpipe*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// A pattern the device's driver version must match (`Mesa 24.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// A pattern the failure's message must match (`*timestamps*`); other failures of
    /// the case stay failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The case fails only sometimes: a pass is a pass, not an unexpected pass.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flaky: bool,
}

/// Whether `text` matches `pattern`, in which `*` stands for any run of characters
/// (none included) and everything else for itself.
pub(crate) fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return text.is_empty();
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole text.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// What an expectation may single a device out by.
#[derive(Debug, Clone, Copy)]
pub struct DeviceFacts<'a> {
    /// The backend's name.
    pub backend: &'a str,
    /// The device's name.
    pub name: &'a str,
    /// The vendor.
    pub vendor: &'a str,
    /// The driver version.
    pub driver: &'a str,
}

impl<'a> DeviceFacts<'a> {
    /// A device known by its backend only (its name, vendor and driver empty).
    pub fn backend(backend: &'a str) -> Self {
        DeviceFacts {
            backend,
            name: "",
            vendor: "",
            driver: "",
        }
    }
}

impl Expectation {
    /// An entry from its three parts, for every device of the backend and every
    /// failure of the case.
    pub fn new(
        backend: impl Into<String>,
        case: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Expectation {
            backend: backend.into(),
            case: case.into(),
            reason: reason.into(),
            vendor: None,
            device: None,
            driver: None,
            message: None,
            flaky: false,
        }
    }

    /// Whether this entry covers `case` run on a device of `backend`, whatever the
    /// device and the failure.
    pub fn matches(&self, backend: &str, case: &str) -> bool {
        glob_matches(&self.backend, backend) && glob_matches(&self.case, case)
    }

    /// Whether this entry covers `case` run on `device` (its backend, vendor, name and
    /// driver), whatever the failure.
    pub fn applies_to(&self, device: &DeviceFacts<'_>, case: &str) -> bool {
        let field = |pattern: &Option<String>, text: &str| {
            pattern.as_deref().is_none_or(|p| glob_matches(p, text))
        };
        self.matches(device.backend, case)
            && field(&self.vendor, device.vendor)
            && field(&self.device, device.name)
            && field(&self.driver, device.driver)
    }

    /// Whether a failure with `message` is the one this entry expects.
    pub fn expects_message(&self, message: &str) -> bool {
        self.message
            .as_deref()
            .is_none_or(|p| glob_matches(p, message))
    }

    /// The entry as a reader would name it: backend, case, and what else it singles
    /// out.
    pub fn describe(&self) -> String {
        let mut out = format!("backend `{}`, case `{}`", self.backend, self.case);
        for (what, value) in [
            ("vendor", &self.vendor),
            ("device", &self.device),
            ("driver", &self.driver),
            ("message", &self.message),
        ] {
            if let Some(v) = value {
                out.push_str(&format!(", {what} `{v}`"));
            }
        }
        if self.flaky {
            out.push_str(", flaky");
        }
        out
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
/// with an `expectations` list; every field but `reason` and `flaky` is a pattern in
/// which `*` stands for any text (see [`Expectation`]):
///
/// ```json
/// { "expectations": [
///     { "backend": "vulkan", "case": "event.elapsed", "device": "llvmpipe*",
///       "driver": "Mesa 24.*", "message": "*timestamps*",
///       "reason": "lavapipe timestamps tick in 1 ms steps" },
///     { "backend": "plugin*", "case": "cast.*", "reason": "casts land in firmware 2.1" },
///     { "backend": "plugin.acme", "case": "event.wait_timeout", "flaky": true,
///       "reason": "the firmware's timer is coarse under load (ACME-211)" }
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
            for (what, value) in [
                ("vendor", &e.vendor),
                ("device", &e.device),
                ("driver", &e.driver),
                ("message", &e.message),
            ] {
                if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                    return Err(Error::invalid(format!(
                        "expectation {{backend: `{}`, case: `{}`}} has an empty `{what}`; leave it out to match every {what}, or give a pattern",
                        e.backend, e.case
                    )));
                }
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

    /// The first entry covering `case` on a device of `backend`, whatever the device.
    pub fn lookup(&self, backend: &str, case: &str) -> Option<&Expectation> {
        self.lookup_for(&DeviceFacts::backend(backend), case)
    }

    /// The first entry covering `case` on `device`: its backend, and its vendor, name
    /// and driver where the entry names them.
    pub fn lookup_for(&self, device: &DeviceFacts<'_>, case: &str) -> Option<&Expectation> {
        self.entries.iter().find(|e| e.applies_to(device, case))
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
    fn patterns_match_the_whole_text() {
        for (p, t, want) in [
            ("*", "", true),
            ("*", "anything", true),
            ("a*", "abc", true),
            ("*c", "abc", true),
            ("a*c", "abc", true),
            ("a*c", "ac", true),
            ("a*b*c", "axxbyyc", true),
            ("*out of memory*", "allocation: out of memory (2 GiB)", true),
            ("abc", "abc", true),
            ("", "", true),
            ("abc", "abcd", false),
            ("a*c", "abcd", false),
            ("a*b*c", "axxc", false),
            ("*x*", "abc", false),
            ("ab*ba", "aba", false),
        ] {
            assert_eq!(glob_matches(p, t), want, "{p} ~ {t}");
        }
    }

    #[test]
    fn an_entry_singles_out_devices_and_failures() {
        let mut e = Expectation::new("vulkan", "event.elapsed", "r");
        e.device = Some("llvmpipe*".into());
        e.driver = Some("Mesa 24.*".into());
        e.message = Some("*timestamps*".into());
        let lavapipe = DeviceFacts {
            backend: "vulkan",
            name: "llvmpipe (LLVM 17)",
            vendor: "Mesa",
            driver: "Mesa 24.2.8",
        };
        assert!(e.applies_to(&lavapipe, "event.elapsed"));
        assert!(!e.applies_to(
            &DeviceFacts {
                driver: "Mesa 25.0",
                ..lavapipe
            },
            "event.elapsed"
        ));
        assert!(!e.applies_to(
            &DeviceFacts {
                name: "AMD Radeon",
                ..lavapipe
            },
            "event.elapsed"
        ));
        assert!(e.expects_message("timestamps tick in 1 ms"));
        assert!(!e.expects_message("the event never completed"));
        e.vendor = Some("AMD".into());
        assert!(!e.applies_to(&lavapipe, "event.elapsed"));
        let list = Expectations { entries: vec![e] };
        assert!(list.lookup_for(&lavapipe, "event.elapsed").is_none());
        // Empty patterns are refused; flaky and the patterns parse.
        let ok = r#"[{"backend":"vulkan","case":"a.b","reason":"r","driver":"Mesa*","message":"*x*","flaky":true}]"#;
        let parsed = Expectations::from_json_str(ok).unwrap();
        assert!(parsed.entries[0].flaky);
        assert_eq!(parsed.entries[0].driver.as_deref(), Some("Mesa*"));
        let bad = r#"[{"backend":"vulkan","case":"a.b","reason":"r","driver":" "}]"#;
        assert!(Expectations::from_json_str(bad)
            .unwrap_err()
            .to_string()
            .contains("driver"));
    }

    #[test]
    fn host_has_no_builtin_expectations() {
        assert!(Expectations::builtin_for("host").is_empty());
    }
}
