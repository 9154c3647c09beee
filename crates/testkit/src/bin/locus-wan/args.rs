//! The command line (clap): `run` a forwarder, `ctl` a running one, `up`/`down` a
//! whole emulated WAN for shell scripts.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::control::{self, Setting};

/// The WAN emulator's forwarder and its controls.
#[derive(Parser, Debug)]
#[command(name = "locus-wan")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Forward frames between interfaces through impaired pipelines until a signal.
    Run(RunArgs),
    /// Send one request (`set [from=I] [to=J] KEY=VALUE...` or `stats`) to a forwarder.
    Ctl {
        /// The forwarder's control socket.
        #[arg(long)]
        control: PathBuf,
        /// The request's words.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        request: Vec<String>,
    },
    /// Build N site namespaces PREFIXs0.. through a forwarder (as `testkit::WanLink`
    /// does), print `ready control=PATH`, and tear everything down on SIGTERM/SIGINT.
    Up(UpArgs),
    /// Delete every namespace whose name starts with PREFIX (idempotent crash cleanup).
    Down {
        #[arg(long)]
        prefix: String,
    },
}

/// Impairment applied to each direction of every site pair.
#[derive(Args, Debug, Clone, Copy)]
pub struct ImpairmentArgs {
    /// One-way delay in ms.
    #[arg(long, default_value = "0", value_parser = control::parse_delay_ms)]
    pub delay_ms: f64,
    /// Random loss in percent.
    #[arg(long, default_value = "0", value_parser = control::parse_loss_pct)]
    pub loss_pct: f64,
    /// Rate limit in Mbit/s (0 = unlimited).
    #[arg(long, default_value = "1000", value_parser = control::parse_rate_mbit)]
    pub rate_mbit: f64,
    /// Rate-limiter queue in bytes, or `auto` for 1.5 × BDP.
    #[arg(long, default_value = "auto", value_parser = control::parse_queue)]
    pub queue_bytes: control::QueueBytes,
}

impl ImpairmentArgs {
    /// The per-direction setting these flags describe.
    pub fn setting(&self) -> Setting {
        Setting {
            delay_ms: self.delay_ms,
            loss_pct: self.loss_pct,
            rate_mbit: self.rate_mbit,
            queue: self.queue_bytes.0,
        }
    }
}

/// `locus-wan run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// An interface to switch between (at least two).
    #[arg(long = "port", required = true, num_args = 1)]
    pub ports: Vec<String>,
    #[command(flatten)]
    pub impairment: ImpairmentArgs,
    /// Seed of the loss PRNG.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Largest frame in bytes (MTU + 18).
    #[arg(long, default_value_t = 9018, value_parser = clap::value_parser!(u32).range(64..=65536))]
    pub max_frame: u32,
    /// Unix datagram socket to answer `ctl` requests on.
    #[arg(long)]
    pub control: Option<PathBuf>,
}

/// `locus-wan up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Namespace name prefix (unique to the caller).
    #[arg(long)]
    pub prefix: String,
    /// Number of sites.
    #[arg(long, default_value_t = 2)]
    pub sites: usize,
    #[command(flatten)]
    pub impairment: ImpairmentArgs,
    /// Seed of the loss PRNG.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// MTU of every veth.
    #[arg(long, default_value_t = testkit::netns::DEFAULT_MTU, value_parser = clap::value_parser!(u32).range(576..=65000))]
    pub mtu: u32,
}

/// Parses the command line; `run` needs two ports at least.
pub fn parse() -> Cli {
    let cli = Cli::parse();
    if let Command::Run(r) = &cli.command
        && r.ports.len() < 2
    {
        use clap::CommandFactory;
        Cli::command().error(clap::error::ErrorKind::TooFewValues, "run needs at least two --port").exit();
    }
    cli
}
