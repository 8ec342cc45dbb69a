//! Supervision: the rules (hang detection, the restart policy, a hung process's native stack;
//! [`rules`], pure and tested without waiting) and the [`Recovery`] that applies them to a
//! running job: it watches each start of the workers and turns the first failure into the
//! job's error ([`recovery`]), and starts the workers again when the policy allows
//! ([`restart`]: the decision, its record, node 0's start and the other nodes following it).
//! Its parts, one job each: [`failures`] (what failed this start), [`nodes`] (other nodes'
//! liveness), [`growth`] (an elastic job's larger start).

mod failures;
mod growth;
mod nodes;
mod recovery;
mod restart;
mod rules;

pub(super) use recovery::Recovery;
