//! Supervision: the rules (hang detection, the restart policy, a hung process's native stack;
//! [`rules`], pure and tested without waiting) and the [`Recovery`] that applies them to a
//! running job: it watches each start of the workers, turns the first failure into the job's
//! error and starts the workers again when the policy allows.

mod recovery;
mod rules;

pub(super) use recovery::{Recovery, Start};
