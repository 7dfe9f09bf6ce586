//! The error of everything the agent does before it serves: which boot step failed, and why.
//! A leaf shared by the boot phase and main, so the phases depend on it and not on each other.

#[derive(Debug, thiserror::Error)]
#[error("sandbox setup failed at {step}: {source}")]
pub struct SetupError {
    pub step: String,
    #[source]
    pub source: std::io::Error,
}

pub(crate) trait Step<T> {
    fn step(self, step: impl Into<String>) -> Result<T, SetupError>;
}

impl<T> Step<T> for std::io::Result<T> {
    fn step(self, step: impl Into<String>) -> Result<T, SetupError> {
        self.map_err(|source| SetupError {
            step: step.into(),
            source,
        })
    }
}
