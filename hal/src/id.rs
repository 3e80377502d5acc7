//! Device identifiers (`backend:index`) and device selectors.
//!
//! Selectors follow the habit of oneAPI's `ONEAPI_DEVICE_SELECTOR`: terms
//! `BACKEND:INDEXES` joined by `;`, where `INDEXES` is `*` or a comma list
//! (`host:0,1;vulkan:*`). `BACKEND` may end in `*` as a prefix wildcard
//! (`plugin*:*` is every device of every plugin), and a bare `*` selects every device.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The identity of a device: its backend's name and its index within that backend.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    /// The backend's registered name (`host`, `vulkan`, `plugin.simnpu` …).
    pub backend: String,
    /// The index within the backend, from 0.
    pub index: u32,
}

impl DeviceId {
    /// A device id from its parts.
    pub fn new(backend: impl Into<String>, index: u32) -> Self {
        DeviceId {
            backend: backend.into(),
            index,
        }
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.index)
    }
}

impl FromStr for DeviceId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let (backend, index) = s.rsplit_once(':').ok_or_else(|| {
            Error::invalid(format!(
                "device id `{s}` has no `:`; write it as BACKEND:INDEX, for example host:0"
            ))
        })?;
        if backend.is_empty() {
            return Err(Error::invalid(format!(
                "device id `{s}` has an empty backend name; write it as BACKEND:INDEX, for example host:0"
            )));
        }
        let index = index.parse::<u32>().map_err(|_| {
            Error::invalid(format!(
                "device id `{s}` has index `{index}`, which is not a non-negative integer"
            ))
        })?;
        Ok(DeviceId::new(backend, index))
    }
}

/// Which indexes of a backend a selector term picks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Indexes {
    All,
    List(Vec<u32>),
}

/// One `BACKEND:INDEXES` term.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    /// Backend name, or a prefix when `prefix` is set.
    backend: String,
    prefix: bool,
    indexes: Indexes,
}

impl Term {
    fn matches_backend(&self, backend: &str) -> bool {
        if self.prefix {
            backend.starts_with(&self.backend)
        } else {
            backend == self.backend
        }
    }
}

/// A parsed device selector such as `host:0,1;vulkan:*` or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSelector {
    terms: Vec<Term>,
    source: String,
}

impl DeviceSelector {
    /// The selector that picks every device (`*`).
    pub fn all() -> Self {
        DeviceSelector {
            terms: vec![Term {
                backend: String::new(),
                prefix: true,
                indexes: Indexes::All,
            }],
            source: "*".to_string(),
        }
    }

    /// Parses a selector; see the module docs for the grammar.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let text = text.trim();
        if text.is_empty() {
            return Err(Error::invalid(
                "the device selector is empty; use `*` for every device or terms like `host:0,1;vulkan:*`",
            ));
        }
        let mut terms = Vec::new();
        for raw in text.split(';') {
            let raw = raw.trim();
            if raw.is_empty() {
                return Err(Error::invalid(format!(
                    "device selector `{text}` has an empty term; separate terms with a single `;`"
                )));
            }
            if raw == "*" {
                terms.push(Term {
                    backend: String::new(),
                    prefix: true,
                    indexes: Indexes::All,
                });
                continue;
            }
            let (backend, idx) = raw.rsplit_once(':').ok_or_else(|| {
                Error::invalid(format!(
                    "selector term `{raw}` has no `:`; write BACKEND:INDEXES such as `host:*` or `host:0,2`"
                ))
            })?;
            let (backend, prefix) = match backend.strip_suffix('*') {
                Some(p) => (p, true),
                None => (backend, false),
            };
            if backend.is_empty() && !prefix {
                return Err(Error::invalid(format!(
                    "selector term `{raw}` has no backend name before `:`"
                )));
            }
            if backend.contains('*') {
                return Err(Error::invalid(format!(
                    "selector term `{raw}`: `*` is only allowed at the end of the backend name"
                )));
            }
            let indexes = if idx.trim() == "*" {
                Indexes::All
            } else {
                let mut list = Vec::new();
                for part in idx.split(',') {
                    let part = part.trim();
                    let n = part.parse::<u32>().map_err(|_| {
                        Error::invalid(format!(
                            "selector term `{raw}`: `{part}` is not a device index; use `*` or a comma list of integers"
                        ))
                    })?;
                    list.push(n);
                }
                Indexes::List(list)
            };
            terms.push(Term {
                backend: backend.to_string(),
                prefix,
                indexes,
            });
        }
        Ok(DeviceSelector {
            terms,
            source: text.to_string(),
        })
    }

    /// Whether the selector picks device `index` of `backend`.
    pub fn matches(&self, backend: &str, index: u32) -> bool {
        self.terms.iter().any(|t| {
            t.matches_backend(backend)
                && match &t.indexes {
                    Indexes::All => true,
                    Indexes::List(l) => l.contains(&index),
                }
        })
    }

    /// Whether the selector could pick any device of `backend` (used to skip probing
    /// backends nobody asked for).
    pub fn mentions_backend(&self, backend: &str) -> bool {
        self.terms.iter().any(|t| t.matches_backend(backend))
    }

    /// Explicit `(backend, index)` pairs named by non-wildcard terms, so that a caller can
    /// report a named device that does not exist instead of silently selecting nothing.
    pub fn explicit_devices(&self) -> Vec<DeviceId> {
        let mut out = Vec::new();
        for t in &self.terms {
            if let (false, Indexes::List(l)) = (t.prefix, &t.indexes) {
                out.extend(l.iter().map(|&i| DeviceId::new(t.backend.clone(), i)));
            }
        }
        out
    }
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl FromStr for DeviceSelector {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        DeviceSelector::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_terms_and_wildcards() {
        let s = DeviceSelector::parse("host:0,2;vulkan:*;plugin*:1").unwrap();
        assert!(s.matches("host", 0));
        assert!(!s.matches("host", 1));
        assert!(s.matches("host", 2));
        assert!(s.matches("vulkan", 7));
        assert!(s.matches("plugin.simnpu", 1));
        assert!(!s.matches("plugin.simnpu", 0));
        assert!(!s.matches("cuda", 0));
        assert_eq!(
            s.explicit_devices(),
            vec![DeviceId::new("host", 0), DeviceId::new("host", 2)]
        );
    }

    #[test]
    fn bare_star_selects_everything() {
        let s = DeviceSelector::parse("*").unwrap();
        assert!(s.matches("host", 3));
        assert!(s.matches("cuda", 0));
    }

    #[test]
    fn rejects_malformed_selectors() {
        for bad in [
            "",
            "host",
            "host:x",
            "ho*st:0",
            ":0",
            "host:0;;cuda:0",
            "host:1,",
        ] {
            let err = DeviceSelector::parse(bad).unwrap_err();
            assert_eq!(err.kind(), "invalid-argument", "{bad}: {err}");
        }
    }

    #[test]
    fn device_ids_round_trip() {
        let id: DeviceId = "plugin.simnpu:3".parse().unwrap();
        assert_eq!(id, DeviceId::new("plugin.simnpu", 3));
        assert_eq!(id.to_string(), "plugin.simnpu:3");
        assert!("host".parse::<DeviceId>().is_err());
        assert!("host:-1".parse::<DeviceId>().is_err());
    }
}
