//! Pure helpers that more than one process needs, in one place so each is written (and fixed) once: Slurm's
//! hostlist syntax, id ranges, time-limit text, and the fair-share decay math the state machine charges with and
//! the scheduler prioritizes with. No I/O; the one wall-clock read (`wall`) is for the processes' edges and never
//! reaches the replicated state.

pub mod decay;
pub mod hostlist;
pub mod model;
pub mod ranges;
pub mod slurm_time;
pub mod wall;
