//! Helpers shared by the files of one integration-test suite (`tests/tests/NAME/`), one
//! module per suite.

pub mod conformance;
pub mod kubernetes;
pub mod north_south;
pub mod packets;
pub mod packets_north_south;
pub mod traffic;
