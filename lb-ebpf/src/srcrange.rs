//! loadBalancerSourceRanges: which clients may open flows to a LoadBalancer frontend.

use crate::maps::{XLB_SRCRNG_V2, XLB_SRCRNG6_V1, src_range_key, src_range6_key};

/// Whether `addr_be` falls in one of the ranges the agent wrote for service `svc_id`.
#[inline(always)]
pub fn allowed(svc_id: u32, addr_be: u32) -> bool {
    XLB_SRCRNG_V2.get(&src_range_key(svc_id, addr_be)).is_some()
}

/// Whether IPv6 `addr_be` falls in one of the IPv6 ranges the agent wrote for `svc_id`.
#[inline(always)]
pub fn allowed6(svc_id: u32, addr_be: &[u32; 4]) -> bool {
    XLB_SRCRNG6_V1
        .get(&src_range6_key(svc_id, addr_be))
        .is_some()
}
