//! `xlb_frontends_failing{reason}`: the frontends the agent cannot (fully) program, by
//! reason (the reconciler's statuses); the agent sets every reason's series, zeros too,
//! at start and after each sync from the few failing frontends it keeps.

use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

type ByReason = [(&'static str, &'static str); 1];

#[derive(Debug, Clone, Default)]
pub(super) struct Failing(Family<ByReason, Gauge>);

impl Failing {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "xlb_frontends_failing",
            "Frontends not (fully) programmed, by reason (MapFull, FrontendConflict, WriteFailed, ...)",
            self.0.clone(),
        );
    }

    /// Each reason's count.
    pub(super) fn set(&self, counts: impl IntoIterator<Item = (&'static str, usize)>) {
        for (reason, n) in counts {
            self.0.get_or_create(&[("reason", reason)]).set(n as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_has_its_count() {
        let (f, mut r) = (Failing::default(), Registry::default());
        f.register(&mut r);
        f.set([("MapFull", 3), ("FrontendConflict", 0)]);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &r).expect("encode");
        assert!(
            text.contains("xlb_frontends_failing{reason=\"MapFull\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("xlb_frontends_failing{reason=\"FrontendConflict\"} 0"),
            "{text}"
        );
    }
}
