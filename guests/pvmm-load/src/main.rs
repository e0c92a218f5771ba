//! `pvmm-load`: a static guest workload for pvmm's rig.
//!
//! N threads each run a busy/idle duty cycle: in every period of `--period-ms` milliseconds a
//! thread spins for `--duty` percent of the period, counting fixed-size units of work
//! ("iterations"), then sleeps for the rest. After `--seconds` (or once the system's uptime
//! reaches `--until-uptime`, so that loads started one after another end together) it prints
//! the iterations of each thread and the total, so a caller can compare work done under
//! different host placements.
//! With `--progress-ms P` it also prints the total so far every P milliseconds, so a caller
//! can count the work done inside a time window of its own.
//!
//! With `--random-reads PATH` it reads random 4 KiB blocks of PATH instead, one at a time past
//! the page cache, for the run time, and prints how many ([`random_read`]).
//!
//! Exit status: 0 on success, 2 on bad flags (one line on stderr), 1 if a thread could not be
//! started.

mod random_read;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most threads accepted: far more than any guest we boot has vCPUs, low enough that a typo
/// (`--threads 40000`) is rejected instead of exhausting the guest's memory.
const MAX_THREADS: u32 = 1024;

/// Longest run accepted, in seconds (one day): a guard against typos, not a real limit.
const MAX_SECONDS: f64 = 86_400.0;

/// Longest period accepted, in milliseconds (one minute): longer periods make a "duty cycle"
/// meaningless over any run we would do.
const MAX_PERIOD_MS: u64 = 60_000;

/// xorshift steps in one iteration: about a microsecond of work on a modern core natively, so
/// reading the clock once per iteration costs little while the busy phase still ends within a
/// few microseconds of its deadline.
const STEPS_PER_ITERATION: u32 = 512;

/// Exit status for bad flags, the same as pvmm's.
const EXIT_BAD_INPUT: u8 = 2;

/// Exit status for a failure after the flags were accepted.
const EXIT_FAILURE: u8 = 1;

const USAGE: &str = "\
usage: pvmm-load [--threads N] [--duty PCT] [--period-ms P] [--seconds S | --until-uptime U]
                 [--progress-ms R] [--random-reads PATH]
  --threads N       worker threads, 1-1024 (default 1)
  --duty PCT        busy share of each period in percent, 0-100 (default 100)
  --period-ms P     duty-cycle period in milliseconds, 1-60000 (default 100)
  --seconds S       run time in seconds, may be fractional, >0 (default 5)
  --until-uptime U  run until the system's uptime (/proc/uptime) reaches U seconds instead:
                    loads started one after another end together
  --progress-ms R   also print 'pvmm-load: progress <total so far>' every R ms, 1-60000
                    (the total counts each thread's periods finished so far)
  --random-reads PATH  instead of the busy threads, read random 4 KiB blocks of PATH (a
                    disk or file) one at a time with O_DIRECT for the run time, and print
                    'pvmm-load: random-reads <count> seconds <run time>'
Prints the iterations done by each thread and the total.";

/// A bad command line.
#[derive(Debug, thiserror::Error, PartialEq)]
enum FlagError {
    #[error("unknown flag '{0}' (see --help)")]
    Unknown(String),
    #[error("{0} and {1} cannot be given together")]
    Exclusive(&'static str, &'static str),
    #[error("flag {0} needs a value")]
    MissingValue(&'static str),
    #[error("invalid value '{value}' for {flag}: {why}")]
    Invalid {
        flag: &'static str,
        value: String,
        why: String,
    },
}

/// What the workload was asked to do.
#[derive(Debug, Clone, PartialEq)]
struct LoadConfig {
    threads: u32,
    duty_percent: u32,
    period: Duration,
    run_time: Duration,
    progress: Option<Duration>,
    /// Run until the system's uptime reaches this many seconds, instead of for `run_time`.
    until_uptime: Option<f64>,
    /// Read random blocks of this disk or file instead of running the busy threads.
    random_reads: Option<PathBuf>,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            threads: 1,
            duty_percent: 100,
            period: Duration::from_millis(100),
            run_time: Duration::from_secs(5),
            progress: None,
            until_uptime: None,
            random_reads: None,
        }
    }
}

/// What the command line asked for: run, or print the usage.
#[derive(Debug, PartialEq)]
enum Command {
    Run(LoadConfig),
    Help,
}

fn parse_int(flag: &'static str, value: &str, min: u64, max: u64) -> Result<u64, FlagError> {
    let parsed: u64 = value.parse().map_err(|_| FlagError::Invalid {
        flag,
        value: value.to_string(),
        why: "not a whole number".into(),
    })?;
    if parsed < min || parsed > max {
        return Err(FlagError::Invalid {
            flag,
            value: value.to_string(),
            why: "out of range (see --help)".into(),
        });
    }
    Ok(parsed)
}

/// A number of seconds above 0 and, with `max`, at most that.
fn parse_seconds(flag: &'static str, value: &str, max: Option<f64>) -> Result<f64, FlagError> {
    let invalid = |why: String| FlagError::Invalid {
        flag,
        value: value.to_string(),
        why,
    };
    let seconds: f64 = value.parse().map_err(|_| invalid("not a number".into()))?;
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(invalid("must be a number above 0".into()));
    }
    match max {
        Some(max) if seconds > max => Err(invalid(format!("must be at most {max}"))),
        _ => Ok(seconds),
    }
}

/// Where the system's uptime is: the first field of `/proc/uptime`.
const UPTIME_PATH: &str = "/proc/uptime";

/// The system's uptime in seconds.
fn uptime() -> Result<f64, String> {
    let text = std::fs::read_to_string(UPTIME_PATH)
        .map_err(|e| format!("cannot read {UPTIME_PATH}: {e}"))?;
    text.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{UPTIME_PATH} does not start with a number: {text:?}"))
}

/// The run time of `config` when started at uptime `now`: `--seconds`, or what is left until
/// `--until-uptime`, which must still be ahead and at most [`MAX_SECONDS`] away.
fn run_time_from(config: &LoadConfig, now: f64) -> Result<Duration, String> {
    match config.until_uptime {
        None => Ok(config.run_time),
        Some(until) if until <= now => Err(format!(
            "--until-uptime {until} has passed (the uptime is {now:.2} s)"
        )),
        Some(until) if until - now > MAX_SECONDS => Err(format!(
            "--until-uptime {until} is more than {MAX_SECONDS} s away (the uptime is {now:.2} s)"
        )),
        Some(until) => Ok(Duration::from_secs_f64(until - now)),
    }
}

/// Parses the flags (without the program name). Accepts `--flag value` and `--flag=value`.
fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Command, FlagError> {
    let mut config = LoadConfig::default();
    let mut seconds_given = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        let (name, inline_value) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                (name.to_string(), Some(value.to_string()))
            }
            _ => (arg.clone(), None),
        };
        let flag: &'static str = match name.as_str() {
            "--threads" => "--threads",
            "--duty" => "--duty",
            "--period-ms" => "--period-ms",
            "--seconds" => "--seconds",
            "--until-uptime" => "--until-uptime",
            "--progress-ms" => "--progress-ms",
            "--random-reads" => "--random-reads",
            _ => return Err(FlagError::Unknown(arg)),
        };
        let value = match inline_value {
            Some(value) => value,
            None => args.next().ok_or(FlagError::MissingValue(flag))?,
        };
        match flag {
            "--threads" => {
                let threads = parse_int(flag, &value, 1, u64::from(MAX_THREADS))?;
                config.threads = u32::try_from(threads).unwrap_or(MAX_THREADS);
            }
            "--duty" => {
                let duty = parse_int(flag, &value, 0, 100)?;
                config.duty_percent = u32::try_from(duty).unwrap_or(100);
            }
            "--period-ms" => {
                config.period = Duration::from_millis(parse_int(flag, &value, 1, MAX_PERIOD_MS)?)
            }
            "--progress-ms" => {
                config.progress = Some(Duration::from_millis(parse_int(
                    flag,
                    &value,
                    1,
                    MAX_PERIOD_MS,
                )?))
            }
            "--seconds" => {
                config.run_time =
                    Duration::from_secs_f64(parse_seconds(flag, &value, Some(MAX_SECONDS))?);
                seconds_given = true;
            }
            "--random-reads" => config.random_reads = Some(PathBuf::from(value)),
            _ => config.until_uptime = Some(parse_seconds(flag, &value, None)?),
        }
    }
    if seconds_given && config.until_uptime.is_some() {
        return Err(FlagError::Exclusive("--seconds", "--until-uptime"));
    }
    Ok(Command::Run(config))
}

/// One unit of work: a chain of xorshift steps the compiler cannot fold away.
fn work_unit(state: &mut u64) {
    let mut x = *state;
    for _ in 0..STEPS_PER_ITERATION {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    *state = std::hint::black_box(x);
}

/// Runs one worker's duty cycle until `end`; returns the iterations done, and publishes the
/// count so far in `done` after each busy phase.
///
/// Periods are laid on an absolute grid from `start`, so time lost to preemption does not shift
/// later periods and the busy share stays what was asked over the whole run.
fn run_worker(config: &LoadConfig, start: Instant, seed: u64, done: &AtomicU64) -> u64 {
    let end = start + config.run_time;
    let busy = config.period * config.duty_percent / 100;
    let mut state = seed | 1;
    let mut iterations: u64 = 0;
    let mut period_start = start;
    while period_start < end {
        let busy_until = (period_start + busy).min(end);
        while Instant::now() < busy_until {
            work_unit(&mut state);
            iterations += 1;
        }
        done.store(iterations, Ordering::Relaxed);
        let period_end = (period_start + config.period).min(end);
        let now = Instant::now();
        if period_end > now {
            std::thread::sleep(period_end - now);
        }
        period_start += config.period;
    }
    iterations
}

fn run(config: &LoadConfig) -> Result<Vec<u64>, std::io::Error> {
    println!(
        "pvmm-load: threads={} duty={}% period={}ms seconds={}",
        config.threads,
        config.duty_percent,
        config.period.as_millis(),
        config.run_time.as_secs_f64()
    );
    let start = Instant::now();
    let done: Arc<Vec<AtomicU64>> =
        Arc::new((0..config.threads).map(|_| AtomicU64::new(0)).collect());
    let mut handles = Vec::with_capacity(config.threads as usize);
    for index in 0..config.threads {
        let worker_config = config.clone();
        let done = done.clone();
        let handle = std::thread::Builder::new()
            .name(format!("load{index}"))
            .spawn(move || {
                let seed = u64::from(index) + 0x9e37_79b9;
                run_worker(&worker_config, start, seed, &done[index as usize])
            })?;
        handles.push(handle);
    }
    if let Some(every) = config.progress {
        let end = start + config.run_time;
        let mut next = start + every;
        while next < end {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let total: u64 = done.iter().map(|d| d.load(Ordering::Relaxed)).sum();
            println!("pvmm-load: progress {total}");
            next += every;
        }
    }
    let mut counts = Vec::with_capacity(handles.len());
    for handle in handles {
        // A worker only panics on a bug; count it as no work rather than aborting the report.
        counts.push(handle.join().unwrap_or(0));
    }
    Ok(counts)
}

fn main() -> ExitCode {
    let command = match parse_args(std::env::args().skip(1)) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("pvmm-load: error: {error}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let config = match command {
        Command::Help => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Command::Run(config) => config,
    };
    let config = if config.until_uptime.is_some() {
        let now = match uptime() {
            Ok(now) => now,
            Err(error) => {
                eprintln!("pvmm-load: error: {error}");
                return ExitCode::from(EXIT_FAILURE);
            }
        };
        match run_time_from(&config, now) {
            Ok(run_time) => LoadConfig { run_time, ..config },
            Err(error) => {
                eprintln!("pvmm-load: error: {error}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    } else {
        config
    };
    if let Some(path) = &config.random_reads {
        return match random_read::run(path, config.run_time) {
            Ok(reads) => {
                let seconds = config.run_time.as_secs_f64();
                println!("pvmm-load: random-reads {reads} seconds {seconds}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!(
                    "pvmm-load: error: --random-reads {}: {error}",
                    path.display()
                );
                ExitCode::from(EXIT_FAILURE)
            }
        };
    }
    match run(&config) {
        Ok(counts) => {
            for (index, count) in counts.iter().enumerate() {
                println!("pvmm-load: thread {index} iterations {count}");
            }
            println!("pvmm-load: total iterations {}", counts.iter().sum::<u64>());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("pvmm-load: error: cannot start a worker thread: {error}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, FlagError> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_all_flags_both_forms() {
        let command = parse(&[
            "--threads",
            "4",
            "--duty=50",
            "--period-ms",
            "20",
            "--seconds=1.5",
        ]);
        assert_eq!(
            command,
            Ok(Command::Run(LoadConfig {
                threads: 4,
                duty_percent: 50,
                period: Duration::from_millis(20),
                run_time: Duration::from_millis(1500),
                progress: None,
                until_uptime: None,
                random_reads: None,
            }))
        );
        let Ok(Command::Run(config)) = parse(&["--random-reads", "/dev/vdb"]) else {
            panic!("--random-reads parses");
        };
        assert_eq!(config.random_reads, Some(PathBuf::from("/dev/vdb")));
        let Ok(Command::Run(config)) = parse(&["--progress-ms", "250"]) else {
            panic!("--progress-ms parses");
        };
        assert_eq!(config.progress, Some(Duration::from_millis(250)));
        assert!(parse(&["--progress-ms", "0"]).is_err());
    }

    #[test]
    fn rejects_bad_flags() {
        assert_eq!(
            parse(&["--bogus"]),
            Err(FlagError::Unknown("--bogus".into()))
        );
        assert_eq!(
            parse(&["--threads"]),
            Err(FlagError::MissingValue("--threads"))
        );
        assert!(matches!(
            parse(&["--threads", "0"]),
            Err(FlagError::Invalid { .. })
        ));
        assert!(matches!(
            parse(&["--threads", "x"]),
            Err(FlagError::Invalid { .. })
        ));
        assert!(matches!(
            parse(&["--duty", "101"]),
            Err(FlagError::Invalid { .. })
        ));
        assert!(matches!(
            parse(&["--period-ms", "0"]),
            Err(FlagError::Invalid { .. })
        ));
        assert!(matches!(
            parse(&["--seconds", "0"]),
            Err(FlagError::Invalid { .. })
        ));
        assert!(matches!(
            parse(&["--seconds", "nan"]),
            Err(FlagError::Invalid { .. })
        ));
        assert!(matches!(
            parse(&["--until-uptime", "-3"]),
            Err(FlagError::Invalid { .. })
        ));
        assert_eq!(
            parse(&["--seconds", "2", "--until-uptime", "100"]),
            Err(FlagError::Exclusive("--seconds", "--until-uptime"))
        );
        assert_eq!(parse(&["-h"]), Ok(Command::Help));
    }

    #[test]
    fn until_uptime_runs_for_what_is_left_and_refuses_a_past_or_distant_uptime() {
        let Ok(Command::Run(config)) = parse(&["--until-uptime=100.5"]) else {
            panic!("--until-uptime parses");
        };
        assert_eq!(config.until_uptime, Some(100.5));
        assert_eq!(
            run_time_from(&config, 98.0),
            Ok(Duration::from_secs_f64(2.5))
        );
        assert!(run_time_from(&config, 100.5).is_err());
        assert!(run_time_from(&config, 101.0).is_err());
        // An uptime beyond a day is fine (a machine up for long); a run of more than a day
        // from now is not.
        let Ok(Command::Run(late)) = parse(&["--until-uptime", "200000"]) else {
            panic!("an uptime beyond a day parses");
        };
        assert_eq!(run_time_from(&late, 199_990.0), Ok(Duration::from_secs(10)));
        assert!(run_time_from(&late, 100.0).is_err());
        let plain = LoadConfig::default();
        assert_eq!(run_time_from(&plain, 1e6), Ok(plain.run_time));
        assert!(uptime().is_ok_and(|u| u > 0.0));
    }

    #[test]
    fn idle_duty_does_no_work_and_full_duty_does_some() {
        let idle = LoadConfig {
            threads: 1,
            duty_percent: 0,
            period: Duration::from_millis(10),
            run_time: Duration::from_millis(50),
            progress: None,
            until_uptime: None,
            random_reads: None,
        };
        let done = AtomicU64::new(0);
        assert_eq!(run_worker(&idle, Instant::now(), 1, &done), 0);
        let busy = LoadConfig {
            duty_percent: 100,
            ..idle
        };
        let n = run_worker(&busy, Instant::now(), 1, &done);
        assert!(n > 0);
        assert_eq!(done.load(Ordering::Relaxed), n);
    }
}
