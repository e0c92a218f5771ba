//! Trace-driven simulator: runs the placement engine over synthetic or recorded vCPU load.
