//! The file store's errors. A failed write, flush or trim of the volume is sticky: the store
//! answers [`Error::Failed`] to every later change until it is opened again, since its table in
//! memory may then say more than the volume holds.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Volume(#[from] salsa_core::Error),
    #[error("no such file or directory: {0}")]
    NotFound(String),
    #[error("invalid file name {0:?}: names are 1 to 4096 bytes of UTF-8 without NUL")]
    InvalidName(String),
    #[error("directory {0} is not empty")]
    NotEmpty(String),
    #[error("the file table is damaged: {0}")]
    Corrupt(String),
    #[error("no room in the file store: {0}")]
    NoSpace(String),
    #[error("volume {0} is not an append-only volume: create it with `salsa volume create --controller amf`")]
    NotAppendOnly(String),
    #[error("volume {0} holds data but no file table: it is not a SALSA file store (use an empty amf volume)")]
    Foreign(String),
    #[error("the file store stopped after an earlier failure and must be reopened: {0}")]
    Failed(String),
}

/// A result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
