//! What Slurm's commands share, written once for all of Drover's: printed fields and their layouts, time as Slurm
//! reads and writes it, node and reservation views. Commands call down into this layer, never into each other.

pub mod arrays;
pub mod fields;
pub mod host;
pub mod nodes;
pub mod openapi;
pub mod reservations;
pub mod time;
