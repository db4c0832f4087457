"""The config: one dataclass per concern, composed into one `RunConfig`.

Every field has a default and a short comment where it is declared; every numeric field its range
(`fields.ranged`). Strings a user types (the seams, the arms, the placements) are validated when
a section is built and read everywhere as typed values through one property each:
`RunConfig.seam_blocks` and `.seam_segments`, `SeamsConfig.arm_names` and `.placements`. They are
no fields, so `to_dict()` (what reports and checkpoints keep) holds what the user typed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from seamkit.config.fields import ConfigError, check_fields, one_of, ranged
from seamkit.config.parse import parse_arms, parse_choice, parse_seams, segments
from seamkit.config.tokenizer_names import check_tokenizer, tokenizer_vocab

OBJECTIVES = ("aux_head", "detached_head", "shared_head", "aux_block", "own_head")
LOCAL_BACKWARDS = ("each", "once")
CALIBRATIONS = ("auto", "run", "bench")  # where seams.placement=best finds each candidate's speed
DTYPES = ("float32", "float64", "bfloat16")
LR_SCHEDULES = ("budget", "steps")
ORDERS = ("interleaved", "sequential")
OPTIMIZERS = ("adamw", "muon")
COMPILES = ("auto", "on", "off")  # train.compile
TRACKERS = ("tensorboard", "wandb")  # train.log_to, besides "none"

# What a study does off its budget's clock (before the arms start, between and after them) is
# sized by config values; each has a ceiling, so no value can stall a study before its budget
# starts or after it ends. The fixed ones are declared with their fields, the relative ones
# checked by `RunConfig` (`_check_off_clock`).
IN_FLIGHT_MAX = 64  # delayed arm: steps the first segment waits for its gradient, delay*(segments-1)
EVAL_BATCHES_MAX = 1024  # held-out batches per evaluation (train.eval_tokens over data.batch*model.seq)
CURVE_POINTS_MAX = 10_000  # loss-curve points per arm, each marked before step 0 and kept in the report
REPEATS_MAX = 100  # seeds per study, each a whole study of every arm
TOKEN_MARKS_MAX = 16  # equal-token marks; an arm keeps 8x as many weight snapshots on disk through a repeat
CALIBRATE_STEPS_MAX = 1000  # steps per calibration candidate and round
CALIBRATE_ROUNDS_MAX = 16  # calibration rounds per candidate


MLPS = ("gelu", "swiglu")  # model.mlp: the seed GPT's GELU MLP, or Llama's SwiGLU
SWIGLU_MULTIPLE = 64  # swiglu's default hidden width is rounded up to a multiple of this


@dataclass
class ModelConfig:
    vocab: int = ranged(151936, gt=0)  # rows of the embedding and the LM head
    dim: int = ranged(512, gt=0)  # residual width
    n_blocks: int = ranged(16, gt=0)  # transformer blocks; seams cut between them
    n_heads: int = ranged(8, gt=0)  # attention heads; dim must divide evenly
    seq: int = ranged(512, gt=0)  # tokens per training row
    mlp_mult: int = ranged(4, gt=0)  # MLP hidden width is mlp_mult * dim (gelu; swiglu: see mlp_hidden)
    rope_base: float = ranged(10000.0, gt=0)  # RoPE frequency base
    norm_eps: float = ranged(1e-6, gt=0)  # RMSNorm epsilon
    dropout: float = ranged(0.0, ge=0, lt=1)  # attention/residual dropout; exact pruning refuses > 0
    mlp: str = "gelu"  # "gelu": proj(gelu(fc x)); "swiglu": Llama's w2(silu(w1 x) * w3 x), w1 and w3 one fused fc
    # MLP hidden width; 0: mlp_mult*dim for gelu, and for swiglu Llama's rule, 2/3 of mlp_mult*dim
    # rounded up to a multiple of SWIGLU_MULTIPLE (384 at dim 128), so both have about the same parameters
    mlp_hidden: int = ranged(0, ge=0)
    kv_heads: int = ranged(0, ge=0)  # key/value heads (grouped-query attention), dividing n_heads; 0: n_heads
    bias: bool = True  # biases on the qkv, attention-output and MLP projections (Llama has none)

    def __post_init__(self):
        check_fields(self, "model")
        if self.dim % self.n_heads:
            raise ConfigError(f"model.dim={self.dim} is not divisible by model.n_heads={self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ConfigError(f"model head size dim/n_heads={self.dim // self.n_heads} must be even for RoPE")
        one_of("model.mlp", self.mlp, MLPS)
        if self.kv_heads and (self.kv_heads > self.n_heads or self.n_heads % self.kv_heads):
            raise ConfigError(f"model.kv_heads={self.kv_heads} must divide model.n_heads={self.n_heads} "
                              f"(0: one per head)")

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads: kv_heads, or n_heads where it is 0 (plain multi-head attention)."""
        return self.kv_heads or self.n_heads

    @property
    def mlp_width(self) -> int:
        """The MLP's hidden width: mlp_hidden, or its default for the kind (see mlp_hidden)."""
        if self.mlp_hidden:
            return self.mlp_hidden
        if self.mlp == "swiglu":
            m = SWIGLU_MULTIPLE
            return -(-(2 * self.mlp_mult * self.dim // 3) // m) * m
        return self.mlp_mult * self.dim


@dataclass
class DataConfig:
    corpus: str = "wordnet"  # "wordnet" (shipped in data/) or a path to a .txt / .jsonl corpus
    # "qwen" (151,936 ids), "bytes" (UTF-8 bytes + end-of-document + pad) or "hf:PATH[#EOD]": a tokenizer.json
    # (or a folder holding one) read with Hugging Face `tokenizers`, its vocabulary from the file
    tokenizer: str = "qwen"
    batch: int = ranged(8, gt=0)  # rows per training step
    window_positions: int = ranged(4864, gt=0)  # max tokens in one packed window of held-out documents
    cache_dir: str = ".cache/seamkit"  # tokenized corpora are cached here

    def __post_init__(self):
        check_fields(self, "data")
        check_tokenizer(self.tokenizer)


@dataclass
class TrainConfig:
    budget_seconds: float = ranged(3600.0, ge=0)  # wall-clock training budget per arm (evaluation excluded); 0: none
    max_steps: int = ranged(0, ge=0)  # stop after this many steps as well; 0: only the budget stops
    lr: float = ranged(3e-4, gt=0)  # AdamW peak learning rate
    min_lr_frac: float = ranged(0.1, ge=0, le=1)  # cosine decay floor, as a fraction of lr
    warmup_steps: int = ranged(100, ge=0)  # linear warm-up
    decay_steps: int = ranged(20000, ge=0)  # length of the cosine decay after warm-up (step-based, same for both arms)
    weight_decay: float = ranged(0.1, ge=0)  # decoupled weight decay (AdamW's and Muon's)
    beta1: float = ranged(0.9, ge=0, lt=1)  # AdamW first-moment decay
    beta2: float = ranged(0.95, ge=0, lt=1)  # AdamW second-moment decay
    # adamw, or muon: Muon (torch.optim.Muon) on the blocks' weight matrices, AdamW on the rest
    # (embedding, head, norms, biases, the aux heads' classifiers), as Muon's authors train
    optimizer: str = "adamw"
    muon_lr: float = ranged(0.02, gt=0)  # Muon's peak learning rate, on the same schedule as lr
    muon_momentum: float = ranged(0.95, ge=0, lt=1)  # Muon's (Nesterov) momentum
    grad_clip: float = ranged(1.0, ge=0)  # global-norm clip; 0 disables
    seed: int = ranged(0, ge=0, le=2**31 - 1)  # weights, data order and random loss masks (what every RNG takes)
    device: str = "auto"  # "auto" (cuda if present), "cpu" or "cuda"
    dtype: str = "float32"  # parameter dtype on CPU; on CUDA float32 weights run under bf16 autocast
    threads: int = ranged(0, ge=0)  # torch threads per process; 0: the free cores (seamkit.threads), shared by ranks
    curve_points: int = ranged(41, ge=2, le=CURVE_POINTS_MAX)  # loss-curve points over the budget, the first at step 0
    checkpoint_every_s: float = ranged(0.0, ge=0)  # also checkpoint every this many training seconds; 0: only at the end
    lr_schedule: str = "budget"  # "budget": warm-up and cosine follow the share of the budget spent; "steps": by step
    warmup_frac: float = ranged(0.02, ge=0, lt=1)  # budget schedule: warm-up share of the run (floor to peak)
    # held-out tokens per evaluation: whole batches (at least one), the val split if smaller; at most
    # EVAL_BATCHES_MAX batches (`RunConfig`): its standard error is 1/32 of one batch's spread by then, and
    # each evaluation runs off the clock
    eval_tokens: int = ranged(32768, gt=0)
    # torch.compile of each block for training (seamkit.accel), compiled and warmed up before the clock
    # starts (its seconds are the report's compile_s): auto (on CUDA, not on the CPU, where it costs
    # about 15 s a compile and gains little), on, off. The chain's placements; pipe and dp run eager
    compile: str = "auto"
    # bitwise-repeatable kernels on CUDA: torch.use_deterministic_algorithms and cuBLAS's fixed
    # workspace (CUBLAS_WORKSPACE_CONFIG), slower; the report's `repeatable` says what a run is. The
    # CPU's kernels are deterministic already
    deterministic: bool = False
    # each arm's curves also to a tracker: none, tensorboard, wandb, or both comma-separated; one run
    # per arm and seed, under runs/ beside the report (seamkit.tracking)
    log_to: str = "none"

    def __post_init__(self):
        check_fields(self, "train")
        self.trackers  # noqa: B018 -- an unknown tracker is one line here
        if self.budget_seconds == 0 and self.max_steps == 0:
            raise ConfigError("train.budget_seconds or train.max_steps must be positive")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"train.device must be auto, cpu or cuda, got {self.device!r}")
        one_of("train.dtype", self.dtype, DTYPES)
        one_of("train.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        one_of("train.optimizer", self.optimizer, OPTIMIZERS)
        one_of("train.compile", self.compile, COMPILES)

    @property
    def trackers(self) -> tuple[str, ...]:
        """`log_to` as the trackers it names, in its order; () for none."""
        names = [n.strip() for n in self.log_to.split(",")]
        if names == ["none"]:
            return ()
        bad = [n for n in names if n not in TRACKERS]
        if bad:
            raise ConfigError(f"train.log_to={self.log_to!r}: {bad[0]!r} is no tracker; give none, or one or more "
                              f"of {', '.join(TRACKERS)} separated by commas")
        return tuple(dict.fromkeys(names))


@dataclass
class SeamsConfig:
    seams: str = "all"  # "all" (after every block but the last), a count "3", or block indices "1,3,5"
    objective: str = "aux_head"  # local objective: aux_head, detached_head, shared_head, aux_block or own_head
    aux_classes: int = ranged(8192, gt=0)  # aux_head: K most frequent training tokens (+1 "other"), capped at vocab
    order: str = "interleaved"  # "interleaved": the arms take turns in slices; "sequential": one after the other
    slice_seconds: float = ranged(2.0, gt=0)  # interleaved: training seconds an arm runs before the next one's turn
    repeats: int = ranged(1, gt=0, le=REPEATS_MAX)  # seeds train.seed, +1, ...; every arm shares each (paired)
    token_marks: int = ranged(3, gt=0, le=TOKEN_MARKS_MAX)  # held-out loss of every arm at this many equal token counts
    devices: int = ranged(0, ge=0)  # the hardware budget every arm gets (seams.placement); 0: auto (free cores, or every GPU)
    placement: str = "best"  # best: each arm its fastest placement here; or e2e=single|dp|pipe:SCHEDULE:M,local=single|stages
    calibration: str = "auto"  # placement=best: auto (a committed calibration of this host, re-timed, else run), run, bench
    # calibration, before the budget starts: steps per candidate (the first quarter is warm-up); the speed
    # drifts 10-20% between minutes (what the rounds are for), so past a few hundred steps it settles no further
    calibrate_steps: int = ranged(12, ge=4, le=CALIBRATE_STEPS_MAX)
    calibrate_rounds: int = ranged(2, ge=1, le=CALIBRATE_ROUNDS_MAX)  # runs per candidate (order reversed each round)
    # then this many more rounds of only the candidates within the drift (calibration.CONTEND_TOL) of
    # an arm's fastest: close calls are settled by more runs, clear ones cost nothing more
    calibrate_contend: int = ranged(2, ge=0, le=CALIBRATE_ROUNDS_MAX)
    # delayed arm: steps an output-gradient takes to cross each seam backwards. Segment k of S waits
    # delay*(S-1-k) steps for its gradient and keeps that many batches in flight (with stashing, a weight
    # copy each: about 85 MiB a step of depth on the cpu preset). delay*(S-1) is at most IN_FLIGHT_MAX
    # (`RunConfig`): past it the first segment learns nothing for a fifth of a cpu-preset arm's ~300 steps
    delay: int = ranged(1, ge=0, le=IN_FLIGHT_MAX)
    weight_stashing: bool = True  # delayed arm: backward under the weights batch t's forward used (else the current ones)
    local_weight: float = ranged(0.0, ge=0)  # delayed arm: weight of each segment's aux_head loss gradient; 0: none
    # delayed arm, PipeMare's learning-rate rescheduling (Yang et al., MLSys 2021): a segment whose
    # gradient comes tau steps late runs at lr / tau**p, p falling linearly from 1 at step 0 to 0 at
    # this step; 0: off (every segment at lr)
    lr_delay_steps: int = ranged(0, ge=0)
    # delayed arm, weight prediction: a segment tau steps late extrapolates its weights along v, an
    # average of its last updates (v <- decay*v + (1-decay)*update), by this fraction of tau steps:
    # with stashing its forward runs at w + s*tau*v, the weights its gradient will be applied to
    # (Chen et al. 2018, SpecTrain); without, its late backward at w - s*tau*v, the weights its
    # forward ran at (PipeMare's discrepancy correction). 0: off; 1: the full tau steps
    weight_prediction: float = ranged(0.0, ge=0, le=4)
    prediction_decay: float = ranged(0.9, ge=0, lt=1)
    # delayed arm, error feedback: a segment tau steps late adds e*tau*(u_t - u_{t-1}) to its update u_t,
    # the newest turn of its own updates carried over its delay (Zmushko et al. 2026, in the kit's form:
    # `seams.corrections`). 0: off
    error_feedback: float = ranged(0.0, ge=0, le=4)
    # delayed arm, Nesterov look-ahead (Ajanthan et al., ICML 2025): the arm trains with NAdamW (AdamW
    # with Nesterov momentum) at this beta1 (the paper's: 0.99) in place of train.optimizer=adamw. 0: off
    nesterov_momentum: float = ranged(0.0, ge=0, lt=1)
    arms: str = "e2e,local"  # the study's arms: a comma list of distinct names from e2e, local, delayed (e2e always)
    # local arm: "each" backpropagates every segment's loss as soon as it is known, which frees that
    # segment's activations before the next runs (local's memory saving); "once" takes one backward
    # over every segment's loss after all forwards (one autocast region, the same gradients bit for
    # bit, every activation alive until then). shared_head refuses "once": its head's gradient sums
    # its segments' in another order
    local_backward: str = "each"

    def __post_init__(self):
        check_fields(self, "seams")
        one_of("seams.objective", self.objective, OBJECTIVES)
        one_of("seams.order", self.order, ORDERS)
        one_of("seams.calibration", self.calibration, CALIBRATIONS)
        one_of("seams.local_backward", self.local_backward, LOCAL_BACKWARDS)
        if self.local_backward == "once" and self.objective == "shared_head":
            raise ConfigError("seams.local_backward=once does not go with seams.objective=shared_head: the shared "
                              "head's gradient would sum its segments' contributions in another order")
        arms = self.arm_names  # parsed here, whether or not a placement names an arm
        extra = [a for a in self.placements if a not in arms]
        if extra:
            raise ConfigError(f"seams.placement={self.placement!r} names the {extra[0]} arm, which seams.arms="
                              f"{self.arms!r} does not run")

    @property
    def arm_names(self) -> tuple[str, ...]:
        """`arms` typed: the arms in their one order (e2e, local, delayed)."""
        return parse_arms(self.arms)

    @property
    def placements(self) -> dict:
        """`placement` typed: {arm: Placement} for the arms it names ({} for best)."""
        return parse_choice(self.placement)


@dataclass
class PruneConfig:
    windows: int = ranged(4, gt=0)  # held-out windows to check and time
    samples: int = ranged(3, gt=0)  # timed samples per window and mode, after warm-up
    warmup: int = ranged(1, ge=0)  # untimed steps per window and mode before sampling
    policy: str = "completion"  # loss policy: all, completion or random:<p>
    split: str = "test"  # held-out split the windows come from
    dtype: str = "float32"  # float32 or float64 (the 1e-12 check)
    reference: str = "inductor"  # inductor: torch.compile of the unpruned step; eager: the eager step, asked for
    exact: str = "arithmetic"  # arithmetic: pruned on every op (float64 within 1e-12); bitwise: CPU bits, slower
    # what the timed steps run in: fp32 (as stored, TF32 off), or bf16 (autocast, with TF32 for the
    # float32 matmuls it leaves, as training runs on CUDA); the compared steps stay in prune.dtype
    precision: str = "fp32"

    def __post_init__(self):
        check_fields(self, "prune")
        check_policy(self.policy)
        one_of("prune.precision", self.precision, ("fp32", "bf16"))
        if self.split not in ("train", "val", "test"):
            raise ConfigError(f"prune.split must be train, val or test, got {self.split!r}")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"prune.dtype must be float32 or float64, got {self.dtype!r}")
        if self.reference not in ("inductor", "eager"):
            raise ConfigError(f"prune.reference must be inductor or eager, got {self.reference!r}")
        if self.exact not in ("arithmetic", "bitwise"):
            raise ConfigError(f"prune.exact must be arithmetic or bitwise, got {self.exact!r}")


def check_policy(policy: str) -> float | None:
    """Validate a loss policy; returns p for `random:<p>`, else None."""
    if policy in ("all", "completion"):
        return None
    if policy.startswith("random:"):
        try:
            p = float(policy.split(":", 1)[1])
        except ValueError:
            p = -1.0
        if 0.0 < p <= 1.0:
            return p
    raise ConfigError(f"loss policy must be all, completion or random:<p> with 0 < p <= 1, got {policy!r}")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seams: SeamsConfig = field(default_factory=SeamsConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    preset: str = "seed"  # the preset this config started from (informational)

    def __post_init__(self):
        need = tokenizer_vocab(self.data.tokenizer)
        if self.model.vocab < need:
            raise ConfigError(f"model.vocab={self.model.vocab} is smaller than the {self.data.tokenizer} "
                              f"tokenizer's {need} ids; --set model.vocab={need}")
        self.seam_blocks  # noqa: B018 -- a bad seam spec fails when the config is built
        _check_off_clock(self)
        if self.seams.nesterov_momentum > 0 and self.train.optimizer != "adamw":
            raise ConfigError(f"seams.nesterov_momentum={self.seams.nesterov_momentum} replaces AdamW by NAdamW; "
                              f"it does not go with train.optimizer={self.train.optimizer}")

    @property
    def seam_blocks(self) -> list[int]:
        """`seams.seams` typed: the block each seam follows."""
        return parse_seams(self.seams.seams, self.model.n_blocks)

    @property
    def seam_segments(self) -> list[list[int]]:
        """The blocks of each segment between the seams."""
        return segments(self.seam_blocks, self.model.n_blocks)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_off_clock(cfg: RunConfig) -> None:
    """The ceilings relative to other sections (the fixed ones are each field's range): the held-out
    batches of an evaluation, and the delayed arm's pipeline depth over the seams it crosses."""
    per_batch = cfg.data.batch * cfg.model.seq
    if cfg.train.eval_tokens > EVAL_BATCHES_MAX * per_batch:
        raise ConfigError(f"train.eval_tokens={cfg.train.eval_tokens} is out of range: must be <= "
                          f"{EVAL_BATCHES_MAX * per_batch} ({EVAL_BATCHES_MAX} batches of data.batch*model.seq)")
    crossed = len(cfg.seam_segments) - 1
    if "delayed" in cfg.seams.arm_names and cfg.seams.delay * crossed > IN_FLIGHT_MAX:
        raise ConfigError(f"seams.delay={cfg.seams.delay} is out of range: must be <= {IN_FLIGHT_MAX // crossed} "
                          f"with {crossed + 1} segments (delay*(segments-1) <= {IN_FLIGHT_MAX} steps in flight)")
