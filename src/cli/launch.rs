//! Processes started by an MPI launcher (`mpirun`, `srun`): the commands that work
//! across processes form one communicator over every process's devices.
//!
//! Without the `mpi` feature no process counts as launched, and [`Launch`] has no
//! value.

use xpu::{Device, Result};
use xpu_collectives::{CommOptions, Communicator};

/// MPI, initialised because an MPI launcher started this process.
#[cfg(feature = "mpi")]
pub struct Launch(xpu_collectives::process::mpi::Mpi);

/// MPI, initialised because an MPI launcher started this process (never, without the
/// `mpi` feature).
#[cfg(not(feature = "mpi"))]
pub enum Launch {}

impl Launch {
    /// MPI when an MPI launcher started this process (initialised, or adopted when the
    /// application already did), else `None`.
    pub fn detect() -> Result<Option<Launch>> {
        #[cfg(feature = "mpi")]
        {
            use xpu_collectives::process::mpi::Mpi;
            Ok(Mpi::launched().then(Mpi::init).transpose()?.map(Launch))
        }
        #[cfg(not(feature = "mpi"))]
        Ok(None)
    }

    /// One communicator over `devices` (this process's) and every other process's.
    pub fn communicator(&self, devices: Vec<Device>, options: CommOptions) -> Result<Communicator> {
        #[cfg(feature = "mpi")]
        {
            Communicator::from_mpi(&self.0, devices, options)
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = (devices, options);
            match *self {}
        }
    }
}
