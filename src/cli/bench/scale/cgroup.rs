//! One cgroup v1 per broker of `malachi bench scale`: a CPU quota
//! (`cpu.cfs_quota_us` over `cpu.cfs_period_us`) and, when the data
//! directory is on a block device, a write-bandwidth cap
//! (`blkio.throttle.write_bps_device`). The paths and the values written
//! are pure functions, tested below; [`BrokerCgroup`] creates the groups
//! and removes them on drop (moving any process still in one to the
//! root first), whatever way the bench ends.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where cgroup v1 mounts its cpu controller.
pub const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
/// Where cgroup v1 mounts its blkio controller.
pub const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";
/// The CFS period each broker's quota is a share of: the kernel's default.
pub const CFS_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts.
const CFS_QUOTA_MIN_US: u64 = 1_000;

/// Why a broker's cgroup could not be set up. Each names the path.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "cannot create cgroup {path}: {source} (bench scale needs root and cgroup v1 cpu and blkio mounted under /sys/fs/cgroup; pass --no-cgroups to run uncapped)"
    )]
    Create { path: PathBuf, source: io::Error },
    #[error(
        "cannot write {value:?} to {path}: {source} (pass --no-cgroups to run uncapped, or --write-bytes-per-second-per-broker 0 to skip the disk cap)"
    )]
    Write {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
}

/// A block device's `major:minor`, as blkio names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    pub major: u64,
    pub minor: u64,
}

/// Where the disk cap goes, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskCap {
    /// The data directory's whole-disk device.
    Device(Device),
    /// No block device to throttle: the reason, for the report.
    Unavailable(String),
}

/// A cgroup's name: unique to this run (`run` is the bench's pid), the
/// broker count and the node.
pub fn group_name(run: u32, brokers: u64, node: u64) -> String {
    format!("malachi-scale-{run}-{brokers}b-node{node}")
}

/// The quota of `cpu_millis` thousandths of a core over `period_us`, at
/// least the kernel's minimum.
pub fn cpu_quota_us(cpu_millis: u64, period_us: u64) -> u64 {
    (period_us.saturating_mul(cpu_millis) / 1_000).max(CFS_QUOTA_MIN_US)
}

/// The line `blkio.throttle.write_bps_device` takes.
pub fn write_bps_line(device: Device, bytes_per_second: u64) -> String {
    format!("{}:{} {bytes_per_second}", device.major, device.minor)
}

/// Splits an `st_dev` as glibc's `major()` and `minor()` do.
pub fn split_dev(dev: u64) -> Device {
    Device {
        major: ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        minor: (dev & 0xff) | ((dev >> 12) & !0xff),
    }
}

/// The filesystem type `/proc/self/mountinfo` gives the mount of `device`
/// (field 3 is `major:minor`; the type follows the ` - ` separator).
pub fn mount_fs_type(mountinfo: &str, device: Device) -> Option<String> {
    let wanted = format!("{}:{}", device.major, device.minor);
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        if fields.nth(2)? != wanted {
            return None;
        }
        let (_, after) = line.split_once(" - ")?;
        after.split_whitespace().next().map(str::to_owned)
    })
}

/// `nr_periods` and `nr_throttled` of a `cpu.stat` file.
pub fn parse_throttling(cpu_stat: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        cpu_stat.lines().find_map(|l| {
            let (key, value) = l.split_once(' ')?;
            (key == name).then(|| value.trim().parse::<u64>().ok())?
        })
    };
    Some((field("nr_periods")?, field("nr_throttled")?))
}

/// The whole-disk device holding `dir`, or why there is none (tmpfs,
/// overlay and other filesystems with no block device behind them).
pub fn disk_of(dir: &Path) -> DiskCap {
    let dev = match std::fs::metadata(dir) {
        Ok(meta) => split_dev(meta.dev()),
        Err(e) => return DiskCap::Unavailable(format!("cannot stat {}: {e}", dir.display())),
    };
    let fs = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|m| mount_fs_type(&m, dev))
        .unwrap_or_else(|| "an unknown filesystem".to_owned());
    let sys = PathBuf::from(format!("/sys/dev/block/{}:{}", dev.major, dev.minor));
    if dev.major == 0 || !sys.exists() {
        return DiskCap::Unavailable(format!(
            "{} is on {fs} ({}:{}), which has no block device: the disk is not capped",
            dir.display(),
            dev.major,
            dev.minor
        ));
    }
    // blkio throttles whole disks: a partition's limit goes on its disk.
    if sys.join("partition").exists() {
        let parent = std::fs::read_to_string(sys.join("..").join("dev")).ok();
        let whole = parent.as_deref().and_then(|text| {
            let (major, minor) = text.trim().split_once(':')?;
            Some(Device {
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
            })
        });
        return match whole {
            Some(device) => DiskCap::Device(device),
            None => DiskCap::Unavailable(format!(
                "cannot find the disk of partition {}:{}",
                dev.major, dev.minor
            )),
        };
    }
    DiskCap::Device(dev)
}

/// One broker's cgroups: removed on drop.
#[derive(Debug)]
pub struct BrokerCgroup {
    cpu_dir: PathBuf,
    blkio_dir: Option<PathBuf>,
}

impl BrokerCgroup {
    /// Creates `name` under the cpu (and, with a disk cap, the blkio)
    /// controller and sets its caps. What was created is removed again if
    /// a later step fails.
    pub fn create(
        name: &str,
        cpu_millis: u64,
        disk: Option<(Device, u64)>,
    ) -> Result<BrokerCgroup, CgroupError> {
        let cpu_dir = Path::new(CPU_ROOT).join(name);
        std::fs::create_dir(&cpu_dir).map_err(|source| CgroupError::Create {
            path: cpu_dir.clone(),
            source,
        })?;
        let mut group = BrokerCgroup {
            cpu_dir,
            blkio_dir: None,
        };
        write(
            &group.cpu_dir.join("cpu.cfs_period_us"),
            &CFS_PERIOD_US.to_string(),
        )?;
        let quota = cpu_quota_us(cpu_millis, CFS_PERIOD_US);
        write(&group.cpu_dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
        if let Some((device, bytes_per_second)) = disk {
            let blkio_dir = Path::new(BLKIO_ROOT).join(name);
            std::fs::create_dir(&blkio_dir).map_err(|source| CgroupError::Create {
                path: blkio_dir.clone(),
                source,
            })?;
            group.blkio_dir = Some(blkio_dir.clone());
            let line = write_bps_line(device, bytes_per_second);
            write(&blkio_dir.join("blkio.throttle.write_bps_device"), &line)?;
        }
        Ok(group)
    }

    /// Moves process `pid` (all its threads) into the group.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        for dir in self.dirs() {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Periods run and periods throttled since the group was created.
    pub fn throttling(&self) -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(self.cpu_dir.join("cpu.stat")).ok()?;
        parse_throttling(&text)
    }

    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.cpu_dir).chain(self.blkio_dir.as_ref())
    }
}

impl Drop for BrokerCgroup {
    fn drop(&mut self) {
        for dir in self.dirs() {
            // A process still inside (a broker not yet reaped) keeps the
            // group busy: move it to the root first.
            let root = dir.parent().map(|p| p.join("cgroup.procs"));
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                if let Some(root) = &root {
                    let _ = std::fs::write(root, pid);
                }
            }
            if let Err(e) = std::fs::remove_dir(dir) {
                tracing::warn!(path = %dir.display(), error = %e, "cannot remove a bench cgroup");
            }
        }
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_owned(),
        value: value.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_per_run_count_and_node() {
        assert_eq!(group_name(4242, 6, 3), "malachi-scale-4242-6b-node3");
        assert_ne!(group_name(1, 3, 1), group_name(1, 6, 1));
    }

    #[test]
    fn a_quota_is_the_share_of_the_period_and_never_below_the_kernels_minimum() {
        assert_eq!(cpu_quota_us(250, 100_000), 25_000);
        assert_eq!(cpu_quota_us(1_000, 100_000), 100_000);
        assert_eq!(cpu_quota_us(2_500, 100_000), 250_000);
        assert_eq!(cpu_quota_us(1, 100_000), 1_000);
    }

    #[test]
    fn the_throttle_line_is_major_minor_and_bytes() {
        let vda = Device {
            major: 254,
            minor: 0,
        };
        assert_eq!(write_bps_line(vda, 16_000_000), "254:0 16000000");
    }

    #[test]
    fn st_dev_splits_as_glibc_does() {
        assert_eq!(
            split_dev(0xfe00),
            Device {
                major: 254,
                minor: 0
            }
        );
        assert_eq!(split_dev(0x0803), Device { major: 8, minor: 3 });
        // Large minors keep their high bits above bit 20.
        assert_eq!(
            split_dev(0x0010_3001),
            Device {
                major: 0x30,
                minor: 0x101
            }
        );
    }

    #[test]
    fn the_filesystem_type_comes_from_the_mount_of_the_device() {
        let mountinfo = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                         25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_fs_type(
                mountinfo,
                Device {
                    major: 0,
                    minor: 23
                }
            )
            .as_deref(),
            Some("tmpfs")
        );
        assert_eq!(
            mount_fs_type(
                mountinfo,
                Device {
                    major: 254,
                    minor: 0
                }
            )
            .as_deref(),
            Some("ext4")
        );
        assert_eq!(
            mount_fs_type(mountinfo, Device { major: 9, minor: 9 }),
            None
        );
    }

    #[test]
    fn throttling_is_read_from_cpu_stat() {
        let stat = "nr_periods 120\nnr_throttled 90\nthrottled_time 4500000000\n";
        assert_eq!(parse_throttling(stat), Some((120, 90)));
        assert_eq!(parse_throttling("nr_periods 1\n"), None);
    }
}
