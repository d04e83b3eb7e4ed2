//! North-south traffic on two nodes (`xlb_tests::twonode`): an external client on node1's
//! uplink reaches NodePort, externalIP and LoadBalancer frontends whose backends live on node1
//! or on node2 (across an underlay). Every answer says which client address the backend saw.

mod dsr;
mod health;
mod maglev;
mod matrix;
mod paths;
mod sctp;
mod snat;
