//! Shared helpers for the floodgate benchmark suites.
