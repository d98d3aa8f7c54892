//! Keys, as the walker and the node views use them: [`Key`] itself is a
//! value type defined below the error type ([`crate::key`]), so that errors
//! can carry keys without `error` depending on `tree`.

pub use crate::key::{Key, item_type_name};
