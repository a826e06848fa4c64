//! Test-only crate: see tests/.
