//! The control socket's requests: paths, methods and bodies turned into typed requests, with
//! every check a request needs done here, before anything changes.

use std::time::Duration;

use pvmm_scheduler::capacity::CAPACITY_SCALE;
use pvmm_scheduler::{CpuSet, PlacementPolicy};
use serde::Deserialize;

use crate::http::{HttpRequest, HttpResponse};
use crate::messages::{ExternalAssignment, ExternalBody, PolicyBody, ShutdownBody};

/// The longest shutdown wait a request may ask for: ten minutes.
pub const MAX_SHUTDOWN_TIMEOUT_MS: u64 = 600_000;

/// What a request may be checked against: the VM's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmShape {
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Host CPUs pvmm may use (`--cpus` within the host topology).
    pub cpus: CpuSet,
}

/// A checked request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiRequest {
    /// `GET /v1/vm`.
    GetVm,
    /// `GET /v1/placement`.
    GetPlacement,
    /// `GET /v1/vcpus`.
    GetVcpus,
    /// `PUT /v1/policy`.
    SetPolicy(PlacementPolicy),
    /// `PUT /v1/placement/external`.
    SetExternal(Vec<ExternalAssignment>),
    /// `DELETE /v1/placement/external`.
    ClearExternal,
    /// `PUT /v1/vm/pause`.
    Pause,
    /// `PUT /v1/vm/resume`.
    Resume,
    /// `PUT /v1/vm/shutdown`, with the request's timeout (None: pvmm's `--shutdown-timeout`).
    Shutdown(Option<Duration>),
}

/// The paths served and the methods each allows.
pub const ROUTES: &[(&str, &str)] = &[
    ("/v1/vm", "GET"),
    ("/v1/placement", "GET"),
    ("/v1/vcpus", "GET"),
    ("/v1/policy", "PUT"),
    ("/v1/placement/external", "PUT, DELETE"),
    ("/v1/vm/pause", "PUT"),
    ("/v1/vm/resume", "PUT"),
    ("/v1/vm/shutdown", "PUT"),
];

fn bad(message: impl Into<String>) -> HttpResponse {
    HttpResponse::error(400, message)
}

fn json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, HttpResponse> {
    serde_json::from_slice(body).map_err(|e| bad(format!("malformed JSON body: {e}")))
}

/// Turns a request into an [`ApiRequest`], or the 4xx answer it deserves.
pub fn parse_request(req: &HttpRequest, shape: &VmShape) -> Result<ApiRequest, HttpResponse> {
    let Some(&(_, allow)) = ROUTES.iter().find(|(p, _)| *p == req.path) else {
        return Err(HttpResponse::error(
            404,
            format!("no such path: {}", req.path),
        ));
    };
    let parsed = match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/vm") => ApiRequest::GetVm,
        ("GET", "/v1/placement") => ApiRequest::GetPlacement,
        ("GET", "/v1/vcpus") => ApiRequest::GetVcpus,
        ("PUT", "/v1/policy") => {
            let body: PolicyBody = json(&req.body)?;
            let policy = body
                .policy
                .parse::<PlacementPolicy>()
                .map_err(|e| bad(format!("policy {:?}: {e}", body.policy)))?;
            ApiRequest::SetPolicy(policy)
        }
        ("PUT", "/v1/placement/external") => {
            ApiRequest::SetExternal(check_assignments(json(&req.body)?, shape)?)
        }
        ("DELETE", "/v1/placement/external") => ApiRequest::ClearExternal,
        ("PUT", "/v1/vm/pause") => ApiRequest::Pause,
        ("PUT", "/v1/vm/resume") => ApiRequest::Resume,
        ("PUT", "/v1/vm/shutdown") => {
            let body: ShutdownBody = if req.body.iter().all(u8::is_ascii_whitespace) {
                ShutdownBody::default()
            } else {
                json(&req.body)?
            };
            if let Some(ms) = body.timeout_ms.filter(|ms| *ms > MAX_SHUTDOWN_TIMEOUT_MS) {
                return Err(bad(format!(
                    "timeout_ms {ms} is over the {MAX_SHUTDOWN_TIMEOUT_MS} ms limit"
                )));
            }
            ApiRequest::Shutdown(body.timeout_ms.map(Duration::from_millis))
        }
        (method, path) => {
            let mut r = HttpResponse::error(
                405,
                format!("{method} is not allowed on {path} (allowed: {allow})"),
            );
            r.allow = Some(allow);
            return Err(r);
        }
    };
    Ok(parsed)
}

fn check_assignments(
    body: ExternalBody,
    shape: &VmShape,
) -> Result<Vec<ExternalAssignment>, HttpResponse> {
    if body.assignments.is_empty() {
        return Err(bad("assignments is empty: name at least one vCPU"));
    }
    let mut seen = vec![false; shape.vcpus as usize];
    let mut out = Vec::with_capacity(body.assignments.len());
    for a in body.assignments {
        let vcpu = a.vcpu;
        let Some(slot) = seen.get_mut(vcpu as usize) else {
            return Err(bad(format!(
                "vcpu {vcpu} is out of range: the VM has {} vCPUs",
                shape.vcpus
            )));
        };
        if std::mem::replace(slot, true) {
            return Err(bad(format!("vcpu {vcpu} is assigned twice")));
        }
        let cpus: CpuSet = a
            .cpus
            .parse()
            .map_err(|e| bad(format!("vcpu {vcpu}: cpus {:?}: {e}", a.cpus)))?;
        if cpus.is_empty() {
            return Err(bad(format!("vcpu {vcpu}: cpus is empty")));
        }
        let outside = cpus.difference(&shape.cpus);
        if !outside.is_empty() {
            return Err(bad(format!(
                "vcpu {vcpu}: CPUs {outside} are outside the CPUs pvmm may use ({})",
                shape.cpus
            )));
        }
        if !(1..=CAPACITY_SCALE).contains(&a.capacity) {
            return Err(bad(format!(
                "vcpu {vcpu}: capacity {} is out of range 1..={CAPACITY_SCALE}",
                a.capacity
            )));
        }
        out.push(ExternalAssignment {
            vcpu,
            cpus,
            capacity: a.capacity,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> VmShape {
        VmShape {
            vcpus: 4,
            cpus: CpuSet::range(0, 3),
        }
    }

    fn req(method: &str, path: &str, body: &str) -> HttpRequest {
        HttpRequest {
            method: method.into(),
            path: path.into(),
            body: body.as_bytes().to_vec(),
            keep_alive: false,
        }
    }

    fn status(method: &str, path: &str, body: &str) -> u16 {
        match parse_request(&req(method, path, body), &shape()) {
            Ok(_) => 200,
            Err(r) => r.status,
        }
    }

    #[test]
    fn good_requests_parse() {
        let p = |m, path, b| parse_request(&req(m, path, b), &shape()).unwrap();
        assert_eq!(p("GET", "/v1/vm", ""), ApiRequest::GetVm);
        assert_eq!(
            p("PUT", "/v1/policy", r#"{"policy":"performance"}"#),
            ApiRequest::SetPolicy("performance".parse().unwrap())
        );
        assert_eq!(p("PUT", "/v1/vm/shutdown", ""), ApiRequest::Shutdown(None));
        assert_eq!(
            p("PUT", "/v1/vm/shutdown", r#"{"timeout_ms":250}"#),
            ApiRequest::Shutdown(Some(Duration::from_millis(250)))
        );
        let ext = r#"{"assignments":[{"vcpu":0,"cpus":"0-1","capacity":512},{"vcpu":3,"cpus":"3","capacity":1024}]}"#;
        let ApiRequest::SetExternal(a) = p("PUT", "/v1/placement/external", ext) else {
            panic!()
        };
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].cpus, CpuSet::range(0, 1));
        assert_eq!(a[1].capacity, 1024);
        assert_eq!(
            p("DELETE", "/v1/placement/external", ""),
            ApiRequest::ClearExternal
        );
    }

    #[test]
    fn every_bad_request_gets_its_4xx() {
        assert_eq!(status("GET", "/v1/nothing", ""), 404);
        assert_eq!(status("GET", "/", ""), 404);
        assert_eq!(status("POST", "/v1/vm", ""), 405);
        assert_eq!(status("GET", "/v1/policy", ""), 405);
        assert_eq!(status("PUT", "/v1/policy", "{"), 400);
        assert_eq!(status("PUT", "/v1/policy", r#"{"policy":"fastest"}"#), 400);
        assert_eq!(
            status("PUT", "/v1/policy", r#"{"policy":"none","x":1}"#),
            400
        );
        let ext = |a: &str| {
            status(
                "PUT",
                "/v1/placement/external",
                &format!(r#"{{"assignments":[{a}]}}"#),
            )
        };
        assert_eq!(ext(""), 400);
        assert_eq!(ext(r#"{"vcpu":4,"cpus":"0","capacity":1}"#), 400);
        assert_eq!(ext(r#"{"vcpu":0,"cpus":"4","capacity":1}"#), 400);
        assert_eq!(ext(r#"{"vcpu":0,"cpus":"x","capacity":1}"#), 400);
        assert_eq!(ext(r#"{"vcpu":0,"cpus":"0","capacity":0}"#), 400);
        assert_eq!(ext(r#"{"vcpu":0,"cpus":"0","capacity":1025}"#), 400);
        assert_eq!(ext(r#"{"vcpu":0,"cpus":"0","capacity":-1}"#), 400);
        assert_eq!(
            ext(r#"{"vcpu":1,"cpus":"0","capacity":9},{"vcpu":1,"cpus":"1","capacity":9}"#),
            400
        );
        assert_eq!(
            status("PUT", "/v1/vm/shutdown", r#"{"timeout_ms":"soon"}"#),
            400
        );
        assert_eq!(
            status("PUT", "/v1/vm/shutdown", r#"{"timeout_ms":600001}"#),
            400
        );
    }

    #[test]
    fn a_405_names_the_allowed_methods() {
        let r = parse_request(&req("GET", "/v1/placement/external", ""), &shape()).unwrap_err();
        assert_eq!(r.allow, Some("PUT, DELETE"));
    }
}
