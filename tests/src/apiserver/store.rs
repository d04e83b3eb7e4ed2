//! The objects and their history: every change is an event holding the object before and
//! after it, so the state of a kind can be rebuilt at any resourceVersion still retained
//! (consistent list pages, `resourceVersionMatch=Exact`) and a watch can tell an object that
//! left its selector (DELETED) from one that changed within it (MODIFIED).
//!
//! Compaction forgets the history up to a resourceVersion, as etcd's does: the state at the
//! compaction point and after it stays readable, and a watch from it is served; only an
//! older resourceVersion is too old.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Objects of one kind by `namespace/name`.
pub(super) type Objects = BTreeMap<String, Value>;

/// One change.
#[derive(Clone, Debug)]
pub(super) struct Event {
    pub rv: u64,
    pub kind: String,
    pub key: String,
    /// The object before the change (`None`: created).
    pub prev: Option<Value>,
    /// The object after it (`None`: deleted).
    pub object: Option<Value>,
}

/// A resourceVersion older than the history kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TooOld {
    pub requested: u64,
    /// The compaction point: the oldest resourceVersion still served.
    pub oldest: u64,
}

#[derive(Debug, Default)]
pub(super) struct Store {
    rv: u64,
    objects: BTreeMap<String, Objects>,
    /// Every change after `compacted`, oldest first.
    events: Vec<Event>,
    compacted: u64,
}

/// `namespace/name` of an object ("/name" without a namespace).
pub(super) fn key_of(obj: &Value) -> String {
    let m = &obj["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

impl Store {
    /// The current resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Creates or replaces `obj` (its `kind` says where); the new resourceVersion.
    pub fn apply(&mut self, mut obj: Value) -> u64 {
        self.rv += 1;
        let kind = obj["kind"].as_str().unwrap_or("").to_string();
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let key = key_of(&obj);
        // The server assigns a uid at creation; a replacement keeps it.
        if obj["metadata"]["uid"].as_str().is_none() {
            let kept = self.objects.get(&kind).and_then(|o| o.get(&key));
            obj["metadata"]["uid"] = match kept.map(|o| o["metadata"]["uid"].clone()) {
                Some(uid) if uid.is_string() => uid,
                _ => json!(format!("00000000-0000-4000-8000-{:012x}", self.rv)),
            };
        }
        let prev = self
            .objects
            .entry(kind.clone())
            .or_default()
            .insert(key.clone(), obj.clone());
        self.events.push(Event {
            rv: self.rv,
            kind,
            key,
            prev,
            object: Some(obj),
        });
        self.rv
    }

    /// The object `kind` `key` now.
    pub fn get(&self, kind: &str, key: &str) -> Option<&Value> {
        self.objects.get(kind)?.get(key)
    }

    /// Every object of `kind` now, by key.
    pub fn all(&self, kind: &str) -> Vec<Value> {
        self.objects
            .get(kind)
            .map(|o| o.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Deletes `kind` `key`; false when there is no such object.
    pub fn delete(&mut self, kind: &str, key: &str) -> bool {
        let Some(prev) = self.objects.get_mut(kind).and_then(|o| o.remove(key)) else {
            return false;
        };
        self.rv += 1;
        self.events.push(Event {
            rv: self.rv,
            kind: kind.to_string(),
            key: key.to_string(),
            prev: Some(prev),
            object: None,
        });
        true
    }

    /// Forgets the history up to the current resourceVersion.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.events.clear();
    }

    fn check(&self, rv: u64) -> Result<(), TooOld> {
        if rv < self.compacted {
            Err(TooOld {
                requested: rv,
                oldest: self.compacted,
            })
        } else {
            Ok(())
        }
    }

    /// The objects of `kind` as they were at `rv` (at most the current one).
    pub fn at(&self, kind: &str, rv: u64) -> Result<Objects, TooOld> {
        self.check(rv)?;
        let mut objects = self.objects.get(kind).cloned().unwrap_or_default();
        for e in self.events.iter().rev().take_while(|e| e.rv > rv) {
            if e.kind != kind {
                continue;
            }
            match &e.prev {
                Some(p) => objects.insert(e.key.clone(), p.clone()),
                None => objects.remove(&e.key),
            };
        }
        Ok(objects)
    }

    /// The changes to `kind` after `rv`, oldest first.
    pub fn since(&self, kind: &str, rv: u64) -> Result<Vec<Event>, TooOld> {
        self.check(rv)?;
        let first = self.events.partition_point(|e| e.rv <= rv);
        Ok(self.events[first..]
            .iter()
            .filter(|e| e.kind == kind)
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, ip: &str) -> Value {
        json!({"kind": "Service", "metadata": {"namespace": "t", "name": name}, "spec": {"clusterIP": ip}})
    }

    #[test]
    fn state_at_any_retained_version() {
        let mut s = Store::default();
        let a = s.apply(svc("a", "1"));
        s.apply(svc("b", "2"));
        s.apply(svc("a", "3"));
        assert!(s.delete("Service", "t/b"));
        assert_eq!(s.at("Service", a).expect("at a").len(), 1);
        let at3 = s.at("Service", 3).expect("at 3");
        assert_eq!(at3["t/a"]["spec"]["clusterIP"], "3");
        assert_eq!(at3["t/b"]["spec"]["clusterIP"], "2");
        assert_eq!(s.at("Service", 4).expect("now").len(), 1);
        assert_eq!(s.since("Service", 2).expect("since").len(), 2);
    }

    #[test]
    fn compaction_keeps_its_own_point() {
        let mut s = Store::default();
        s.apply(svc("a", "1"));
        s.apply(svc("a", "2"));
        s.compact();
        assert_eq!(s.since("Service", 2).map(|e| e.len()), Ok(0));
        assert_eq!(
            s.since("Service", 1).map(|e| e.len()),
            Err(TooOld {
                requested: 1,
                oldest: 2
            })
        );
        assert!(s.at("Service", 2).is_ok());
        s.apply(svc("a", "3"));
        assert_eq!(s.since("Service", 2).map(|e| e.len()), Ok(1));
    }
}
