//! Errors of the loader.

/// What can go wrong with the loaded datapath.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The datapath is asked for before the loader's start hook ran.
    #[error("the datapath is not loaded yet (the loader starts before every cell that uses it)")]
    NotLoaded,
    /// The datapath is waited for before the `load-datapath` hook started loading it.
    #[error("the datapath's load was not started (`load-datapath` runs before `datapath-loaded`)")]
    NotStarted,
    /// Loading failed.
    #[error("cannot load the datapath")]
    Load(#[source] cellium_datapath_bpf::Error),
    /// `bpf-conntrack-accounting` could not be written into the datapath's settings.
    #[error("cannot set bpf-conntrack-accounting in the datapath's settings")]
    Accounting(#[source] cellium_datapath_bpf::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
