//! [`Pins`]: one pin directory's maps, each opened once (`BPF_OBJ_GET` on its pin) when
//! the handle is made, and handed to the readers and writers from there: the agent opens
//! them after its programs are loaded, `xlb list`, `xlb trace` and the hand-back when they
//! start. The directory's path stays in the handle for what truly needs a path (the status
//! file beside the maps, link pins, the previous layout's pins during an upgrade).

use std::{
    collections::BTreeMap,
    os::fd::AsFd,
    path::{Path, PathBuf},
    sync::Arc,
};

use aya::maps::{Map, MapData, MapError};
use lb_common::ALL_MAPS;

use super::DatapathError;

/// The pinned maps of one directory, opened once; cheap to clone (the threads that read
/// the maps share it).
#[derive(Clone, Debug)]
pub struct Pins(Arc<Opened>);

#[derive(Debug)]
struct Opened {
    dir: PathBuf,
    /// Every map of this layout ([`ALL_MAPS`]) that is pinned in `dir`.
    maps: BTreeMap<&'static str, Map>,
}

impl Pins {
    /// Opens every map of this layout pinned in `dir`. A map not pinned there (no agent
    /// ran with it, an older agent's layout) is not an error until it is asked for.
    pub fn open(dir: &Path) -> Result<Self, DatapathError> {
        let mut maps = BTreeMap::new();
        for name in ALL_MAPS {
            match MapData::from_pin(dir.join(name)) {
                Ok(data) => {
                    let map = Map::from_map_data(data)
                        .map_err(|source| DatapathError::Map { name, source })?;
                    maps.insert(name, map);
                }
                Err(MapError::SyscallError(e))
                    if e.io_error.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(DatapathError::Map { name, source }),
            }
        }
        Ok(Self(Arc::new(Opened {
            dir: dir.to_path_buf(),
            maps,
        })))
    }

    /// The pin directory.
    pub fn dir(&self) -> &Path {
        &self.0.dir
    }

    /// Whether map `name` is pinned (an optional map, as the IPv6 tables of an agent that
    /// pinned none).
    pub fn has(&self, name: &str) -> bool {
        self.0.maps.contains_key(name)
    }

    /// Map `name` as opened: aya's typed maps over a `&MapData` read through it.
    pub fn get(&self, name: &'static str) -> Result<&Map, DatapathError> {
        self.0
            .maps
            .get(name)
            .ok_or_else(|| DatapathError::NotPinned {
                name,
                dir: self.0.dir.clone(),
            })
    }

    /// Map `name`'s data as opened (its descriptor, the kernel's information on it).
    pub fn data(&self, name: &'static str) -> Result<&MapData, DatapathError> {
        data_of(self.get(name)?).ok_or(DatapathError::MapMissing { name })
    }

    /// Map `name` as aya's [`Map`], over a duplicate of the descriptor opened (no second
    /// look-up of the pin): what aya's typed maps that write, or own their map, are made of.
    pub fn map(&self, name: &'static str) -> Result<Map, DatapathError> {
        let fd = self
            .data(name)?
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| DatapathError::Map {
                name,
                source: MapError::IoError(e),
            })?;
        let data = MapData::from_fd(fd).map_err(|source| DatapathError::Map { name, source })?;
        Map::from_map_data(data).map_err(|source| DatapathError::Map { name, source })
    }
}

/// The data of a map of the kinds xlb pins.
fn data_of(map: &Map) -> Option<&MapData> {
    match map {
        Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::Array(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::LpmTrie(d)
        | Map::DevMapHash(d) => Some(d),
        _ => None,
    }
}
