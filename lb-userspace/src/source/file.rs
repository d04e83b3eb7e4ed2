//! The YAML file source: v1 Service and discovery.k8s.io/v1 EndpointSlice documents.

use std::{
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
use serde::Deserialize;

use super::{
    SourceError,
    convert::{self, Converted},
    testconfig,
};
use crate::model::Model;

/// What one read of the file produced: the model of every object that was valid, the
/// errors of those that were not, and what was ignored on purpose.
#[derive(Debug, Default)]
pub struct Loaded {
    pub model: Model,
    pub errors: Vec<SourceError>,
    pub ignored: Vec<String>,
    /// The `kind: TestConfig` header of a kube-proxy conformance case, when the file has one.
    pub test_config: Option<testconfig::TestConfig>,
}

/// Parses a multi-document YAML text. A document that is not a Service or EndpointSlice is
/// ignored; an invalid object is reported and left out, every other object is kept.
pub fn parse(path: &str, text: &str) -> Result<Loaded, SourceError> {
    parse_step(path, text, None)
}

/// As [`parse`], keeping only the objects present in `step` of a multi-step conformance
/// case (see [`testconfig::present_in_step`]); `None` keeps everything.
pub fn parse_step(path: &str, text: &str, step: Option<u32>) -> Result<Loaded, SourceError> {
    let mut loaded = Loaded::default();
    for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc).map_err(|source| SourceError::Yaml {
            path: path.to_string(),
            source,
        })?;
        if value.is_null() {
            continue;
        }
        let api_version = value
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let kind = value
            .get("kind")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let decode_err = |source| SourceError::Decode {
            path: path.to_string(),
            index,
            kind: kind.clone(),
            source,
        };
        if let Some(step) = step
            && !testconfig::present_in_step(&value, step)
        {
            continue;
        }
        match (api_version, kind.as_str()) {
            (_, "TestConfig") if api_version.starts_with("peertest.kube-proxy.local/") => {
                match testconfig::parse(&value) {
                    Ok(tc) => loaded.test_config = Some(tc),
                    Err(e) => loaded.errors.push(e),
                }
            }
            ("v1", "Service") => {
                let svc: core::Service = serde_yaml::from_value(value).map_err(decode_err)?;
                match convert::service(&svc) {
                    Ok(Converted::Take(s)) => loaded.model.upsert_service(s),
                    Ok(Converted::Ignore(why)) => loaded.ignored.push(why),
                    Err(e) => loaded.errors.push(e),
                }
            }
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                let slice: discovery::EndpointSlice =
                    serde_yaml::from_value(value).map_err(decode_err)?;
                match convert::endpoint_slice(&slice) {
                    Ok(Converted::Take(s)) => loaded.model.upsert_slice(s),
                    Ok(Converted::Ignore(why)) => loaded.ignored.push(why),
                    Err(e) => loaded.errors.push(e),
                }
            }
            _ => loaded.ignored.push(format!(
                "{path}: document {index} is {api_version} {kind}, not a Service or EndpointSlice"
            )),
        }
    }
    Ok(loaded)
}

/// Reads and parses a file.
pub fn load(path: &Path) -> Result<Loaded, SourceError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SourceError::Io {
        path: shown.clone(),
        source,
    })?;
    parse(&shown, &text)
}

/// Notices when a file changes (modification time, size or content), polling cheaply.
pub struct FileWatch {
    path: PathBuf,
    last: Option<(SystemTime, u64, u64)>,
}

impl FileWatch {
    pub fn new(path: PathBuf) -> Self {
        Self { path, last: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True the first time, and whenever the file differs from the last call.
    pub fn changed(&mut self) -> bool {
        let stamp = std::fs::read(&self.path).ok().and_then(|bytes| {
            let meta = std::fs::metadata(&self.path).ok()?;
            Some((meta.modified().ok()?, meta.len(), fnv1a(&bytes)))
        });
        if stamp.is_some() && stamp != self.last {
            self.last = stamp;
            true
        } else {
            false
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: demo
  name: web-abc
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: ["10.244.2.2"]
  conditions: {ready: true}
- addresses: ["10.244.3.2"]
"#;

    #[test]
    fn parses_services_and_slices() {
        let l = parse("t.yaml", GOOD).expect("parse");
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        assert_eq!(l.model.services.len(), 1);
        let (id, svc) = l.model.services.iter().next().expect("one");
        let be = l.model.backends(id, &svc.ports[0]);
        let shown: Vec<String> = be.iter().map(|b| b.to_string()).collect();
        assert_eq!(shown, ["10.244.2.2:8080/TCP", "10.244.3.2:8080/TCP"]);
    }

    #[test]
    fn a_bad_object_is_named_and_the_rest_is_kept() {
        let bad = GOOD.replace("10.96.0.10", "10.96.0.999")
            + r#"
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: dns}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, protocol: ICMP}]
---
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: ok}
spec:
  clusterIP: 10.96.0.54
  ports: [{name: dns, port: 53, protocol: UDP}]
"#;
        let l = parse("t.yaml", &bad).expect("parse");
        let msgs: Vec<String> = l.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(msgs[0].contains("Service demo/web") && msgs[0].contains("10.96.0.999"));
        assert!(msgs[1].contains("Service demo/dns") && msgs[1].contains("ICMP"));
        assert_eq!(l.model.services.len(), 1);
        assert!(l.model.services.keys().any(|k| k.name == "ok"));
    }

    #[test]
    fn wrong_family_addresses_are_skipped_and_unknown_address_types_are_errors() {
        let bad = GOOD.replace("10.244.3.2", "2001:db8::1");
        let l = parse("t.yaml", &bad).expect("parse");
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        let (id, svc) = l.model.services.iter().next().expect("one");
        let be: Vec<String> = l
            .model
            .backends(id, &svc.ports[0])
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(
            be,
            ["10.244.2.2:8080/TCP"],
            "the IPv4 endpoint stays, the IPv6 one is skipped"
        );
        let bad = GOOD.replace("addressType: IPv4", "addressType: IPX");
        let l = parse("t.yaml", &bad).expect("parse");
        assert!(l.errors[0].to_string().contains("unknown address family"));
    }

    #[test]
    fn broken_yaml_is_an_error_for_the_whole_file() {
        assert!(parse("t.yaml", "kind: [unclosed").is_err());
    }
}
