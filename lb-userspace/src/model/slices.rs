//! [`Slices`]: a Service's EndpointSlices by name, in a small vector sorted by name (a
//! Service has one slice per 100 endpoints and family, usually one to three): the first
//! held inline in the model's B-tree entry, no B-tree node or box per service.

use smallvec::SmallVec;

use super::{EndpointSlice, Name};

/// A service's slices, in name order (each slice's name is its key).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Slices(SmallVec<[EndpointSlice; 1]>);

impl Slices {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|s| (*s.name).cmp(name))
    }

    /// The slice named `name`.
    pub fn get(&self, name: &str) -> Option<&EndpointSlice> {
        self.find(name).ok().map(|i| &self.0[i])
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Adds `slice` or replaces the one of its name; returns the one replaced.
    pub fn insert(&mut self, slice: EndpointSlice) -> Option<EndpointSlice> {
        match self.find(&slice.name) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i], slice)),
            Err(i) => {
                self.0.insert(i, slice);
                None
            }
        }
    }

    /// Takes the slice named `name` out.
    pub fn remove(&mut self, name: &str) -> Option<EndpointSlice> {
        let i = self.find(name).ok()?;
        let s = self.0.remove(i);
        if self.0.spilled() && self.0.len() <= 1 {
            self.0.shrink_to_fit();
        }
        Some(s)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The slices in name order.
    pub fn values(&self) -> std::slice::Iter<'_, EndpointSlice> {
        self.0.iter()
    }

    /// The slices' names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &Name> {
        self.0.iter().map(|s| &s.name)
    }

    /// (name, slice), in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&Name, &EndpointSlice)> {
        self.0.iter().map(|s| (&s.name, s))
    }
}

impl<'a> IntoIterator for &'a Slices {
    type Item = (&'a Name, &'a EndpointSlice);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, EndpointSlice>,
        fn(&'a EndpointSlice) -> (&'a Name, &'a EndpointSlice),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|s| (&s.name, s))
    }
}

/// The slices, in name order.
impl IntoIterator for Slices {
    type Item = EndpointSlice;
    type IntoIter = smallvec::IntoIter<[EndpointSlice; 1]>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, port: u16) -> EndpointSlice {
        EndpointSlice {
            name: name.into(),
            ports: [super::super::EndpointPort {
                port,
                ..Default::default()
            }]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn slices_are_kept_by_name_in_order() {
        let mut s = Slices::default();
        assert!(s.insert(slice("b", 1)).is_none());
        assert!(s.insert(slice("a", 2)).is_none());
        assert!(s.insert(slice("c", 3)).is_none());
        let old = s.insert(slice("b", 4)).expect("replaced");
        assert_eq!(old.ports[0].port, 1);
        let names: Vec<&str> = s.keys().map(|n| &**n).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(s.get("b").map(|x| x.ports[0].port), Some(4));
        assert!(s.remove("a").is_some() && s.remove("a").is_none());
        assert!(!s.contains_key("a") && s.contains_key("c"));
        assert_eq!(s.len(), 2);
        s.remove("b");
        s.remove("c");
        assert!(s.is_empty());
    }
}
