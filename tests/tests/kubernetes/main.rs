//! `xlb agent --source kubernetes` against the test API server (tests/src/apiserver/), with
//! real traffic: initial lists gate the first write, scaling, terminating endpoints, deletes,
//! a cut watch, a 410 Gone relist without disruption, and the service-proxy-name selector;
//! and the API server's ways the agent must take as the real one's: a watch served from the
//! compaction point, paged lists at one resourceVersion (and an expired continue token), a
//! Service leaving the label selector (DELETED), watches from the current state, 403/429/
//! 500/503 and an API server down at start or later, and one kind's list held while the
//! others complete; 1,000 endpoint changes in a burst; odd objects (a null condition time,
//! unknown fields, an undecodable field) that never fail the watch; and the Events the
//! agent writes on a Service whose frontend fails to program or recovers.

mod burst;
mod decode;
mod events;
mod faults;
mod follow;
mod lists;
mod serve;
