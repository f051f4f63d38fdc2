"""Every setting of `attrib-agent run` / `replay --serve`, as data: name, file section, parser, default, help.

One table drives the flags, the environment names, the TOML keys, validation and `describe()`, so the
four stay in step; docs/configuration.md is checked against it by a test. Defaults come from the modules
that use them (pipeline, attributor); the poller's are repeated here (cheap `--help`) and tested equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from attrib_agent.attribution.attributor import AttributionConfig
from attrib_agent.attribution.cost_model import FIT_WINDOW, StepCostPrior
from attrib_agent.attribution.forecast import ForecastSettings
from attrib_agent.config import values as v
from attrib_agent.config.types import HostPort, Secret, shown
from attrib_agent.pipeline import PipelineConfig

ENV_PREFIX: Final = "ATTRIB_"
CONFIG_ENV: Final = "ATTRIB_CONFIG"  # the config file's path, when no --config flag is given
SECTIONS: Final = ("vllm", "otlp", "nvml", "api", "journal", "attribution", "forecast", "agent")
MiB: Final = 2**20
# The poller's defaults, repeated so `--help` need not import httpx; a test keeps them equal.
DEFAULT_INTERVAL_S: Final = 0.25
DEFAULT_TIMEOUT_S: Final = 1.0
MIN_INTERVAL_S: Final = 0.05


@dataclass(frozen=True)
class Setting:
    name: str
    section: str
    parse: Callable[[object], Any]
    default: Any
    help: str
    metavar: str = "VALUE"
    boolean: bool = False  # a --x/--no-x flag
    live: bool = False  # read by `run` only (the sources); `replay --serve` has no flag for it
    flag: bool = True  # False for secrets: a flag's value shows in `ps`
    file: bool = True  # False for secrets: config files end up in ConfigMaps and repositories
    default_text: str | None = None  # how the default reads in help and docs, when not its value

    @property
    def shown_default(self) -> str:
        return self.default_text if self.default_text is not None else shown(self.default)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")


MAX_TOKEN_CHARS: Final = 4096


def parse_token(value: object) -> Secret:
    """A bearer token: printable ASCII without spaces (it goes in an Authorization header). Never echoed."""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {v.type_name(value)}")
    token = value.strip()
    if not token:
        raise ValueError("the token is empty")
    if len(token) > MAX_TOKEN_CHARS or not all(33 <= ord(c) <= 126 for c in token):
        raise ValueError(f"a token is 1-{MAX_TOKEN_CHARS} printable ASCII characters without spaces")
    return Secret(token)


_P, _A, _F = PipelineConfig(), AttributionConfig(), ForecastSettings()
_S = Setting
SETTINGS: Final[tuple[Setting, ...]] = (
    # ---- vLLM: where to read it, and facts about it the agent would otherwise infer
    _S("vllm_url", "vllm", v.http_url, None, "vLLM's base URL; /metrics is scraped from it", "URL",
       live=True, default_text="required for run"),
    _S("metrics_interval_s", "vllm", v.seconds(MIN_INTERVAL_S), DEFAULT_INTERVAL_S,
       "seconds between /metrics scrapes", "SECONDS", live=True),
    _S("metrics_timeout_s", "vllm", v.seconds(0, inclusive=False), DEFAULT_TIMEOUT_S,
       "time-out of one /metrics scrape", "SECONDS", live=True),
    _S("log_file", "vllm", v.path, None, "follow vLLM's log file (like tail -F); excludes log_stdin",
       "PATH", live=True, default_text="none"),
    _S("log_stdin", "vllm", v.parse_bool, False,
       "read vLLM's log from standard input (vLLM's output piped in); excludes log_file", boolean=True, live=True),
    _S("log_from", "vllm", v.choice(("end", "start")), "end",
       "where to start reading log_file: `end` (only new lines) or `start` (the whole file)", "end|start",
       live=True),
    _S("log_poll_interval_s", "vllm", v.seconds(0.01), 0.1, "how often log_file is checked for new lines",
       "SECONDS", live=True),
    _S("plugin_socket", "vllm", v.path, None, "exact mode: bind this unix datagram socket for vLLM's step plugin "
       "(its ATTRIB_PLUGIN_SOCKET; docs/exact-mode.md)", "PATH", live=True, default_text="none (exact mode off)"),
    _S("engine", "vllm", v.count(0, 1023), _P.engine, "which vLLM engine (data-parallel rank) to attribute",
       "INDEX"),
    _S("block_size", "vllm", v.count(1, 65536), _P.block_size,
       "KV block size in tokens", "TOKENS",
       default_text="from vllm:cache_config_info"),
    _S("num_blocks", "vllm", v.count(1, 2**31), _P.num_blocks,
       "KV blocks in the pool", "BLOCKS",
       default_text="from vllm:cache_config_info"),
    _S("token_budget", "vllm", v.count(1, 2**31), _P.token_budget,
       "vLLM's max_num_batched_tokens", "TOKENS",
       default_text="inferred from the engine steps"),
    # ---- OTLP: vLLM's llm_request spans in, passed on, and the agent's own spans out
    _S("otlp_grpc_port", "otlp", v.port, 4317, "OTLP/gRPC receiver port for vLLM's spans (0: off)", "PORT",
       live=True),
    _S("otlp_http_port", "otlp", v.port, 4318, "OTLP/HTTP receiver port for vLLM's spans (0: off)", "PORT",
       live=True),
    _S("otlp_bind", "otlp", v.host, "127.0.0.1", "address the OTLP receivers listen on", "HOST", live=True),
    _S("otlp_max_body_bytes", "otlp", v.size_bytes(1024, 2**30), 8 * MiB,
       "largest OTLP export accepted (HTTP body or gRPC message)", "BYTES", live=True,
       default_text="8MiB"),
    _S("otlp_forward", "otlp", v.otlp_target, None, "pass every received export on to this collector; the "
       "scheme picks the protocol (http(s):// or grpc(s)://; `none`: off)", "URL", live=True,
       default_text="off"),
    _S("otlp_export", "otlp", v.otlp_target, None, "send the agent's attrib.slowdown spans here (`none`: off)",
       "URL", default_text="the otlp_forward target, else off"),
    # ---- NVML
    _S("nvml", "nvml", v.parse_bool, True, "sample GPU memory and utilisation through NVML (reports "
       "`unavailable` once where there is no GPU)", boolean=True, live=True),
    _S("nvml_interval_s", "nvml", v.seconds(0.1), 1.0, "seconds between GPU samples", "SECONDS", live=True),
    # ---- the agent's HTTP endpoint: /metrics, the API, the page
    _S("listen", "api", v.host_port, HostPort("127.0.0.1", 9400),
       "address of the agent's /metrics, API and page: host:port or [IPv6]:port", "HOST:PORT"),
    _S("api_token", "api", parse_token, None,
       "bearer token the API requires (env ATTRIB_API_TOKEN only; never a flag or file key)",
       flag=False, file=False, default_text="none: the API is open"),
    _S("api_token_file", "api", v.path, None, "read the API token from this file (a mounted Secret)", "PATH",
       default_text="none"),
    # ---- journal of results
    _S("journal_dir", "journal", v.path, None, "keep every final result as JSON lines here", "DIR",
       default_text="off"),
    _S("journal_max_bytes", "journal", v.size_bytes(MiB, 2**40), 256 * MiB,
       "most disk space the journal may use", "BYTES",
       default_text="256MiB"),
    # ---- attribution
    _S("settle_interval_s", "attribution", v.seconds(0.01), _P.settle_interval_s,
       "event time between attribution passes", "SECONDS"),
    _S("partial_timeout_s", "attribution", v.seconds(1), _P.partial_timeout_s,
       "a partial result becomes final this long after its request finished", "SECONDS"),
    _S("victim_threshold_s", "attribution", v.seconds(0), _P.victim_threshold_s,
       "slowdown that counts a request as slowed", "SECONDS"),
    _S("whale_factor", "attribution", v.ratio(1.0), _A.whale_factor,
       "a request holding this many times the median KV footprint is a whale", "FACTOR"),
    _S("max_players", "attribution", v.count(1, 10), _A.max_players,
       "whales per busy period given exact Shapley values (2^n simulations each)", "N"),
    _S("noise_floor_s", "attribution", v.seconds(0), _A.noise_floor_s,
       "TTFT slowdown below this (or half the solo TTFT) counts as no interference", "SECONDS"),
    _S("step_cost_prior", "attribution", StepCostPrior.parse, _A.step_cost_prior,
       "step costs used until prior_min_steps steps are fitted: intercept, per prefill token, per decoding "
       "request, per decode context token, per prefill pair, step gap (seconds; default fitted on a 2-core CPU)",
       "A,B,C,D,E,F"),
    _S("prior_min_steps", "attribution", v.count(1, FIT_WINDOW), _A.prior_min_steps,
       "engine steps seen before the step costs are fitted from them instead of taken from step_cost_prior", "N"),
    _S("itl_floor_ratio", "attribution", v.ratio(0.0), _A.itl_floor_ratio,
       "the uncontended ITL is at least this times the cost model's solo ITL", "FACTOR"),
    _S("quality_floor_s", "attribution", v.seconds(0.001), _A.quality_floor_s,
       "TTFTs shorter than this are compared at this scale in a result's quality", "SECONDS"),
    _S("unfinished_end_s", "attribution", v.seconds(1), _A.unfinished_end_s,
       "a request not yet finished is simulated as running this long after its arrival", "SECONDS"),
    _S("max_results", "attribution", v.count(1, 10_000_000), _P.max_results,
       "results kept in memory for the API", "N"),
    _S("max_result_age_s", "attribution", v.seconds(1), _P.max_result_age_s,
       "results older than this are dropped from memory", "SECONDS"),
    _S("max_pending", "attribution", v.count(1, 10_000_000), _P.max_pending,
       "victims waiting for attribution or refinement (the oldest are dropped beyond)", "N"),
    _S("slo_ttft_s", "attribution", v.seconds(0, inclusive=False), _P.slo.ttft_s,
       "TTFT budget of the goodput series", "SECONDS"),
    _S("slo_itl_s", "attribution", v.seconds(0, inclusive=False), _P.slo.itl_s,
       "ITL budget of the goodput series", "SECONDS"),
    _S("shape_long_prompt_tokens", "attribution", v.count(1, 10_000_000), _P.slo.long_prompt_tokens,
       "prompts this long are long (li*) in the goodput series' shapes", "TOKENS"),
    _S("shape_long_output_tokens", "attribution", v.count(1, 10_000_000), _P.slo.long_output_tokens,
       "outputs this long are long (*lo) in the goodput series' shapes", "TOKENS"),
    # ---- the admission forecast (POST /v1/forecast, attrib_forecast_reference_harm_seconds)
    _S("forecast_ttft_slo_s", "forecast", v.seconds(0, inclusive=False), _F.config.ttft_slo_s,
       "TTFT SLO a forecast counts requests pushed past", "SECONDS"),
    _S("forecast_itl_p95_slo_s", "forecast", v.seconds(0, inclusive=False), _F.config.itl_p95_slo_s,
       "ITL p95 SLO a forecast counts requests pushed past", "SECONDS"),
    _S("forecast_horizon_s", "forecast", v.seconds(0.1), _F.config.horizon_s,
       "how far ahead a forecast runs the expected arrivals", "SECONDS"),
    _S("forecast_reference_prompt_tokens", "forecast", v.count(1, 10_000_000), _F.reference.prompt_tokens,
       "prompt of the reference whale whose harm the gauge reports", "TOKENS"),
    _S("forecast_reference_max_tokens", "forecast", v.count(1, 10_000_000), _F.reference.max_tokens,
       "max_tokens of the reference whale", "TOKENS"),
    # ---- the agent itself
    _S("log_level", "agent", v.choice(("DEBUG", "INFO", "WARNING", "ERROR"), upper=True), "INFO",
       "level of the agent's own log", "LEVEL"),
)
BY_NAME: Final = {s.name: s for s in SETTINGS}
EXCLUSIVE: Final = (("log_file", "log_stdin"), ("api_token", "api_token_file"))  # one choice each


def is_chosen(value: Any) -> bool:
    """Whether a value picks its side of an EXCLUSIVE pair (log_stdin=false picks nothing)."""
    return value is not False and value is not None
