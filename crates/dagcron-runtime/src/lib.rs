//! dagcron's runtime: the engine that turns schedules into durable runs and
//! runs their tasks, and the clock it depends on.

pub mod clock;
pub mod engine;

pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{Engine, EngineConfig, EngineError, EngineEvent, EngineHandle, Observer};
