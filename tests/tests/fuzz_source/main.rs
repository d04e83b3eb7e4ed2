//! Property tests (proptest) of the YAML → model → desired path (`source::file`,
//! `source::convert`, the model, `desired`): generated files of Services and EndpointSlices,
//! valid and broken — bad IPs, ports out of range, unknown protocols, missing fields, fields
//! of the wrong type, duplicated frontends, huge counts, arbitrary values where objects
//! belong, mangled text. Properties: nothing panics; every error names its object; a bad
//! object never keeps the others out of the model or the maps; the desired maps are
//! consistent, stable and within their limits.

mod checks;
mod generate;
mod properties;
