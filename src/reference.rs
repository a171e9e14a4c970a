//! CPU float64 reference (filled in by the runtime issue).
