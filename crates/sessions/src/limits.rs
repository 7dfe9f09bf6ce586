//! What a session may use: its limits (request over defaults, within the server's and the
//! plan's maxima), its timeout and its metadata, all checked before a sandbox is touched.

use std::collections::BTreeMap;

use koder_api_types::Limits;

use crate::config::SessionConfig;
use crate::Error;

const MAX_METADATA_ENTRIES: usize = 64;
const MAX_METADATA_KEY: usize = 256;
const MAX_METADATA_VALUE: usize = 2048;

/// Request over defaults, checked against the server maxima and the tenant plan's.
pub(crate) fn effective(cfg: &SessionConfig, req: Limits, plan: &str) -> Result<Limits, Error> {
    let d = cfg.default_limits;
    let m = match cfg.plans.get(plan) {
        Some(p) => tighter(&cfg.max_limits, &p.max_limits),
        None => cfg.max_limits,
    };
    let pick = |name: &str,
                asked: Option<u64>,
                default: Option<u64>,
                max: Option<u64>|
     -> Result<Option<u64>, Error> {
        let v = asked.or(default);
        match (v, max) {
            (Some(0), _) => Err(Error::InvalidArgument(format!(
                "limits.{name} must be positive"
            ))),
            (Some(v), Some(max)) if v > max => Err(Error::InvalidArgument(format!(
                "limits.{name} = {v} exceeds the maximum {max} of this server and plan"
            ))),
            _ => Ok(v),
        }
    };
    Ok(Limits {
        cpu_millis: pick(
            "cpu_millis",
            req.cpu_millis.map(u64::from),
            d.cpu_millis.map(u64::from),
            m.cpu_millis.map(u64::from),
        )?
        .map(|v| v as u32),
        memory_mib: pick("memory_mib", req.memory_mib, d.memory_mib, m.memory_mib)?,
        disk_mib: pick("disk_mib", req.disk_mib, d.disk_mib, m.disk_mib)?,
        pids: pick("pids", req.pids, d.pids, m.pids)?,
    })
}

/// `timeout_s` if the server allows it.
pub(crate) fn timeout(cfg: &SessionConfig, timeout_s: u64) -> Result<u64, Error> {
    if timeout_s == 0 || timeout_s > cfg.max_timeout_s {
        return Err(Error::InvalidArgument(format!(
            "timeout_s must be 1..={}",
            cfg.max_timeout_s
        )));
    }
    Ok(timeout_s)
}

/// Field by field, the smaller of two sets of maxima (`None` = no maximum).
fn tighter(a: &Limits, b: &Limits) -> Limits {
    fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
        match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }
    Limits {
        cpu_millis: min(a.cpu_millis.map(u64::from), b.cpu_millis.map(u64::from)).map(|v| v as u32),
        memory_mib: min(a.memory_mib, b.memory_mib),
        disk_mib: min(a.disk_mib, b.disk_mib),
        pids: min(a.pids, b.pids),
    }
}

pub(crate) fn validate_metadata(meta: &BTreeMap<String, String>) -> Result<(), Error> {
    if meta.len() > MAX_METADATA_ENTRIES {
        return Err(Error::InvalidArgument(format!(
            "at most {MAX_METADATA_ENTRIES} metadata entries"
        )));
    }
    if meta
        .iter()
        .any(|(k, v)| k.is_empty() || k.len() > MAX_METADATA_KEY || v.len() > MAX_METADATA_VALUE)
    {
        return Err(Error::InvalidArgument(format!(
            "metadata keys must be 1-{MAX_METADATA_KEY} bytes and values at most {MAX_METADATA_VALUE}"
        )));
    }
    Ok(())
}

pub(crate) fn to_runtime_limits(l: &Limits) -> koder_runtime::Limits {
    koder_runtime::Limits {
        cpu_millis: l.cpu_millis,
        memory_mib: l.memory_mib,
        pids: l.pids,
        disk_mib: l.disk_mib,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PlanConfig;

    fn limits(cpu: Option<u32>, mem: Option<u64>, disk: Option<u64>, pids: Option<u64>) -> Limits {
        Limits {
            cpu_millis: cpu,
            memory_mib: mem,
            disk_mib: disk,
            pids,
        }
    }

    #[test]
    fn tighter_takes_the_smaller_maximum_and_none_means_unbounded() {
        let a = limits(Some(4000), Some(100), None, None);
        let b = limits(Some(500), Some(200), Some(7), None);
        assert_eq!(tighter(&a, &b), limits(Some(500), Some(100), Some(7), None));
        assert_eq!(tighter(&b, &a), tighter(&a, &b));
    }

    #[test]
    fn effective_fills_defaults_and_applies_the_plan_maximum() {
        let mut cfg = SessionConfig::default();
        let plan = PlanConfig {
            max_limits: limits(None, Some(256), None, None),
        };
        cfg.plans.insert("small".into(), plan);
        let asked = limits(None, Some(300), None, None);
        assert!(effective(&cfg, asked, "free").is_ok());
        let err = effective(&cfg, asked, "small").unwrap_err().to_string();
        assert!(
            err.contains("memory_mib = 300") && err.contains("256"),
            "{err}"
        );
        let got = effective(&cfg, Limits::default(), "small")
            .unwrap_err()
            .to_string();
        // The server default (512 MiB) is above this plan's maximum too.
        assert!(got.contains("memory_mib = 512"), "{got}");
        let got = effective(&cfg, limits(Some(250), Some(64), None, None), "small").unwrap();
        assert_eq!(got, limits(Some(250), Some(64), Some(1024), Some(256)));
    }

    #[test]
    fn effective_refuses_zero() {
        let cfg = SessionConfig::default();
        let err = effective(&cfg, limits(None, None, None, Some(0)), "free").unwrap_err();
        assert!(
            err.to_string().contains("limits.pids must be positive"),
            "{err}"
        );
    }

    #[test]
    fn timeout_bounds() {
        let cfg = SessionConfig::default();
        assert!(timeout(&cfg, 0).is_err());
        assert_eq!(timeout(&cfg, cfg.max_timeout_s).unwrap(), cfg.max_timeout_s);
        assert!(timeout(&cfg, cfg.max_timeout_s + 1).is_err());
    }

    #[test]
    fn metadata_bounds() {
        let entry = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(validate_metadata(&entry("k", &"v".repeat(MAX_METADATA_VALUE))).is_ok());
        assert!(validate_metadata(&entry("k", &"v".repeat(MAX_METADATA_VALUE + 1))).is_err());
        assert!(validate_metadata(&entry("", "v")).is_err());
        assert!(validate_metadata(&entry(&"k".repeat(MAX_METADATA_KEY + 1), "v")).is_err());
        let many: BTreeMap<String, String> = (0..=MAX_METADATA_ENTRIES)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        assert!(validate_metadata(&many).is_err());
        let most: BTreeMap<String, String> = many.into_iter().skip(1).collect();
        assert!(validate_metadata(&most).is_ok());
    }

    #[test]
    fn runtime_limits_carry_every_field() {
        let l = to_runtime_limits(&limits(Some(1), Some(2), Some(3), Some(4)));
        assert_eq!(
            (l.cpu_millis, l.memory_mib, l.disk_mib, l.pids),
            (Some(1), Some(2), Some(3), Some(4))
        );
    }
}
