//! Code-interpreter contexts of a session (being written).
