"""The rules stage of train.log triage: real-looking excerpts, ranking, and hostile input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.triage import rules
from app.triage.corpus import build, handwritten
from app.triage.digest import digest
from app.triage.rules import STATES, UNSURE, action_for, classify, read_tail

HANDWRITTEN = handwritten()


@pytest.mark.parametrize("row", HANDWRITTEN, ids=[r["id"] for r in HANDWRITTEN])
def test_handwritten_excerpt_is_classified(row: dict) -> None:
    """Each hand-written excerpt, modelled on how real failures print, gets its labelled state."""
    v = classify(row["log"], idle_seconds=row["idle_seconds"])
    assert v.state == row["state"], (v.rule, v.evidence)
    assert v.evidence and all(isinstance(e, str) for e in v.evidence)


def test_the_real_error_outranks_the_launcher_traceback_printed_after_it() -> None:
    """Given an OOM followed by torchrun's ChildFailedError and a CalledProcessError, the state is oom."""
    log = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 1.\n"
        "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600123 milliseconds before timing out.\n"
    )
    v = classify(log)
    assert v.state == "oom"
    assert "CUDA out of memory" in v.evidence[0]


def test_completed_loses_to_a_fatal_error_printed_after_it() -> None:
    """A crash after 'Training completed' (e.g. the final save hits a full disk) is that crash."""
    log = "Training completed. Do not forget to share your model on huggingface.co/models =)\nOSError: [Errno 28] No space left on device\n"
    assert classify(log).state == "io_error"
    assert action_for("io_error", ("OSError: [Errno 28] No space left on device",)) == "replace the host (disk)"
    assert action_for("io_error", ("requests.exceptions.ReadTimeout",)) == "retry on the same host (network)"
    # refused access: neither a retry nor another host can help
    denied = "stop the job, tell the operator (access denied: grant it or fix the credentials)"
    assert action_for("io_error", ("PermissionError: [Errno 13] Permission denied: '/out/checkpoint-500'",)) == denied
    assert action_for("io_error", ("huggingface_hub.errors.GatedRepoError: 403 Client Error.",)) == denied
    assert action_for("io_error", ("botocore.exceptions.ClientError: An error occurred (AccessDenied)",)) == denied
    # a full disk decides first, even when a write was also refused on the way
    assert (
        action_for("io_error", ("OSError: [Errno 28] No space left on device", "Permission denied"))
        == "replace the host (disk)"
    )


def test_transient_warnings_followed_by_progress_are_progressing() -> None:
    """A wandb network hiccup or a retry, then more training steps, is still progressing."""
    log = (
        "wandb: Network error (ConnectionError), entering retry loop.\n"
        "Retrying in 2s [Retry 1/5].\n"
        "iter 1200: loss 1.8821, time 212.40ms, mfu 29.91%\n"
    )
    assert classify(log, idle_seconds=10).state == "progressing"


def test_a_log_that_stopped_growing_is_stalled_but_a_finished_one_is_completed() -> None:
    """Idle past the threshold means stalled, unless the log says the run completed."""
    progress = "{'loss': 1.2, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': 0.6}\n 60%|██████    | 600/1000 [10:00<06:40, 1.00s/it]\n"
    assert classify(progress, idle_seconds=30).state == "progressing"
    assert classify(progress, idle_seconds=5000).state == "stalled"
    done = progress + "Training completed. Do not forget to share your model on huggingface.co/models =)\n"
    assert classify(done, idle_seconds=5000).state == "completed"


def test_fp16_loss_scale_reductions_are_normal_but_underflow_is_diverged() -> None:
    """Skipped fp16 steps while the scale stays >= 1 are progress; a scale below 1 is divergence."""
    ok = (
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
        "[Rank 0] step=1210, skipped=3, lr=[1.88e-05], mom=[(0.9, 0.999)]\n"
    )
    assert classify(ok, idle_seconds=5).state == "progressing"
    bad = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1.52587890625e-05\n"
    assert classify(bad).state == "diverged"


def test_megatron_zero_nan_iterations_is_not_divergence() -> None:
    """Megatron's 'number of nan iterations: 0' on every line is normal progress."""
    line = (
        " iteration      100/  10000 | consumed samples: 51200 | lm loss: 2.871234E+00 | loss scale: 1.0 |"
        " grad norm: 0.412 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )
    assert classify(line * 3, idle_seconds=5).state == "progressing"


def test_an_oom_counter_at_zero_is_not_an_oom() -> None:
    """fairseq logs `| oom 0 |` in every epoch summary: a counter at zero is no OOM; the word itself still is."""
    line = (
        "| epoch 027 | loss 6.343 | nll_loss 4.984 | ppl 31.65 | wps 164346 | gnorm 0.390 | clip 0% | oom 0 "
        "| loss_scale 0.500 | wall 23080 | train_wall 21383\n"
    )
    assert classify(line * 3, idle_seconds=5).state == "progressing"
    assert classify(line * 3 + "ERROR: OOM in the forward pass, aborting\n").state == "oom"


def test_nccl_info_no_device_found_is_not_a_cuda_fault() -> None:
    """'NCCL INFO NET/IB : No device found.' is normal on hosts without InfiniBand."""
    log = "NCCL INFO NET/IB : No device found.\n{'loss': 1.44, 'grad_norm': 0.31, 'learning_rate': 0.0002, 'epoch': 0.08}\n"
    assert classify(log, idle_seconds=5).state == "progressing"


@pytest.mark.parametrize(
    "junk",
    [
        "",
        "\n\n\n",
        "\x00\x01\x02" * 1000,
        "\x1b[31mERROR\x1b[0m \x1b]0;title\x07 plain",
        "\r".join(f" {i}%|█         | {i}/100 [00:01<00:10, 9.0it/s]" for i in range(100)),
        "�" * 50_000,
        "a" * 200_000,
    ],
    ids=["empty", "blank", "nul", "ansi", "cr-bars", "replacement", "one-long-line"],
)
def test_bad_input_always_yields_a_verdict(junk: str) -> None:
    """Empty, binary, ANSI, carriage-return and oversized input never crash and give a state or unsure with a guess."""
    v = classify(junk, idle_seconds=1)
    assert v.state in (*STATES, UNSURE)
    assert v.guess in STATES


def test_ansi_colours_and_carriage_returns_do_not_hide_the_error() -> None:
    """An OOM in red after a CR-redrawn progress bar is found."""
    log = " 10%|█ | 10/100 [00:01<00:10]\r 11%|█ | 11/100 [00:01<00:10]\r\x1b[31mtorch.OutOfMemoryError: CUDA out of memory.\x1b[0m\n"
    v = classify(log)
    assert v.state == "oom"
    assert "\x1b" not in v.evidence[0]


def test_a_2gb_log_is_read_from_its_tail_in_bounded_time(tmp_path: Path) -> None:
    """A sparse 2 GB file with an OOM at the end is triaged from its last 32 KB only (a seek, not a read)."""
    path = tmp_path / "train.log"
    with path.open("wb") as fh:
        fh.truncate(2 * 1024**3)
        fh.seek(0, os.SEEK_END)
        fh.write(b"\xff\xfe not utf-8 \x80\nRuntimeError: CUDA error: out of memory\n")
    tail = read_tail(path)
    v = classify(tail)
    assert len(tail) <= rules.DEFAULT_TAIL_BYTES
    assert v.state == "oom"


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=3000), st.one_of(st.none(), st.floats(allow_nan=True)))
def test_any_text_and_any_idle_value_gives_a_verdict(text: str, idle: float | None) -> None:
    """Property: arbitrary text (and NaN/inf/negative idle) always returns a valid verdict."""
    v = classify(text, idle_seconds=idle)
    assert v.state in (*STATES, UNSURE)
    assert v.guess in STATES
    assert 0.0 <= v.confidence <= 1.0


def test_every_rule_match_on_the_corpus_contains_one_of_its_needles() -> None:
    """The needle prefilter is safe: a full-text search never finds a match without a needle in its line."""
    rows = [*build(3, per_cell_train=2, per_cell_eval=0, per_cell_ood=2)["train"], *HANDWRITTEN]
    for row in rows:
        low = rules.normalise(row["log"]).lower()
        for rule in rules._RULES:
            for m in rule.pattern.finditer(low):
                if rule.check is not None and not rule.check(m):
                    continue
                start = low.rfind("\n", 0, m.start()) + 1
                end = low.find("\n", m.end())
                line = low[start : end if end >= 0 else len(low)]
                assert "\n" not in m.group(0), (rule.name, m.group(0)[:200])
                assert any(n in line for n in rule.needles), (rule.name, line[:200])


def test_the_corpus_is_deterministic_and_covers_every_state_and_split() -> None:
    """The same seed yields the same rows; every split has every state; OOD frameworks never appear in train."""
    a = build(5, per_cell_train=1, per_cell_eval=1, per_cell_ood=1)
    b = build(5, per_cell_train=1, per_cell_eval=1, per_cell_ood=1)
    assert a == b
    for split in ("train", "eval", "ood"):
        assert {r["state"] for r in a[split]} == set(STATES)
    assert not {r["framework"] for r in a["train"]} & {r["framework"] for r in a["ood"]}


def test_the_digest_is_short_and_keeps_the_deciding_line() -> None:
    """The specialist's digest is bounded and leads with the most specific error line."""
    noise = "".join(f"[rank{i}] traceback : To enable traceback see: https://pytorch.org\n" for i in range(150))
    log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n" + noise
    d = digest(log, idle_seconds=10)
    assert len(d) <= 700
    assert d.startswith("idle fresh | torch.OutOfMemoryError")


def test_the_docs_report_renders_pooled_slices_per_state_tables_and_a_confusion_matrix() -> None:
    """docs/triage.md's generated block: the pooled real halves and the generated slices, precision and
    recall per state, the chain's confusion matrix, between its two markers."""
    from app.triage.report import BEGIN, END, per_state, render

    text = render(None)
    assert text.startswith(BEGIN) and text.rstrip().endswith(END)
    assert "| real excerpts, test halves of " in text and "| hand-written excerpts" in text
    assert text.count("| state | rows | rules precision | rules recall | chain precision | chain recall |") == 2
    assert text.count("| label \\ predicted |") == 1
    for state in STATES:
        assert text.count(f"| `{state}` |") == 3
    stats = per_state([("oom", "oom"), ("oom", "stalled"), ("stalled", "stalled")])
    assert stats["oom"]["recall"] == 0.5 and stats["stalled"]["precision"] == 0.5


def test_the_one_pass_prefilter_finds_exactly_what_a_full_search_finds() -> None:
    """For every rule, the first match found via the candidate lines equals a brute-force search of the whole tail."""
    rows = [*build(4, per_cell_train=1, per_cell_eval=0, per_cell_ood=1)["train"], *HANDWRITTEN]
    for row in rows:
        low = rules._lower_same_length(rules.normalise(row["log"]))
        cands = rules._candidate_lines(low)
        for idx, rule in enumerate(rules._RULES):
            brute = next((m for m in rule.pattern.finditer(low) if rule.check is None or rule.check(m)), None)
            fast = rules._first_match(rule, low, cands.get(idx, []))
            assert (brute.start() if brute else None) == (fast.start() if fast else None), (rule.name, row["id"])


@pytest.mark.parametrize(
    ("line", "state"),
    [
        ("[job] FATAL: the accelerator on slot 2 stopped responding", "cuda_fault"),
        ("ERROR run: not enough host memory to build the index", "oom"),
        ("ERROR optimizer: parameters became infinite after update 812; halting", "diverged"),
        ("ERROR io: could not write the adapter to /mnt/out: quota exceeded on volume", "io_error"),
        ("ERROR dist: peers did not respond within 600s; giving up", "stalled"),
        ("ERROR data: column 'answer' is missing in 14 rows", "data_error"),
        ("INFO job finished successfully; all 3 epochs done", "completed"),
    ],
)
def test_error_semantics_generalise_beyond_exact_phrases(line: str, state: str) -> None:
    """A failure word plus what failed decides the state even in wording no rule names exactly."""
    log = "step 10 loss=1.2\nstep 20 loss=1.1\n" + line + "\n"
    assert classify(log, idle_seconds=30).state == state


def test_warnings_and_error_metrics_on_a_healthy_log_stay_progressing() -> None:
    """Warnings mentioning errors, and metrics named error_rate/failed_samples, do not make a running log a failure."""
    log = (
        "UserWarning: failed to import flash_attn, falling back to sdpa (memory use may be higher)\n"
        "step 100 | loss 1.742 | error_rate 0.31 | failed_samples_skipped 0\n"
        "step 110 | loss 1.738 | error_rate 0.30 | failed_samples_skipped 0\n"
    )
    assert classify(log, idle_seconds=10).state == "progressing"


def test_training_paraphrases_and_held_out_wordings_are_disjoint() -> None:
    """No failure template used to train the specialist appears in a held-out or OOD wording set."""
    from app.triage import corpus

    train = {t for ts in corpus._PARAPHRASE.values() for t in ts}
    for held in (corpus._FRESH, corpus._CUSTOM, corpus._WORDING):
        assert not train & {t for ts in held.values() for t in ts}
    built = build(2, per_cell_train=1, per_cell_eval=1, per_cell_ood=2)
    assert {r["framework"] for r in built["train"]}.isdisjoint({"fresh", "custom", "wording"})


def test_torchrun_rank_prefixes_do_not_hide_line_anchored_errors() -> None:
    """'[rank0]: Traceback ...' and '[rank0]: TypeError: ...' read like the unprefixed lines (a bare exception: unsure, guess data_error)."""
    log = (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/home/axolotl/src/axolotl/cli/train.py", line 125, in <module>\n'
        "[rank0]: TypeError: None is not a callable object\n"
    )
    v = classify(log, idle_seconds=30)
    assert v.guess == "data_error"
    assert v.evidence[0].startswith("TypeError")
    assert classify("[rank1]: torch.OutOfMemoryError: CUDA out of memory.\n").state == "oom"


def test_a_closing_summary_is_completion_only_with_no_failure_before_it() -> None:
    """detectron2 prints its summary in a `finally`: after an OOM it is not a completed run."""
    summary = (
        "[06/09 11:05:25 d2.engine.hooks]: Overall training speed: 22 iterations in 0:01:02 (2.8448 s / it)\n"
        "[06/09 11:05:25 d2.engine.hooks]: Total training time: 0:01:02 (0:00:00 on hooks)\n"
    )
    iters = "".join(
        f"[06/09 11:0{i}:00 d2.utils.events]:  iter: {i * 20}  total_loss: 0.{9 - i}  lr: 0.02\n" for i in range(5)
    )
    assert classify(iters + summary).state == "completed"
    oom = (
        "ERROR [06/09 11:05:25 d2.engine.train_loop]: Exception during training:\nTraceback (most recent call last):\n"
        "    losses.backward()\nRuntimeError: CUDA out of memory. Tried to allocate 1.71 GiB (GPU 0; 31.72 GiB total capacity)\n"
    )
    assert classify(iters + oom + summary).state == "oom"
    assert classify(iters + "Estimated total training time: 3:10:00\n").state == "progressing"


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("|    loss                 | 0.214        |\n|    n_updates            | 40           |\n", "progressing"),
        ("    KeyError: 'None is not in the dataset registry'\n", "data_error"),  # indented as posted
        ("ssl.py, line 1130, in read\nTimeoutError: The read operation timed out\n", "io_error"),
        ("scale reached (0.0001). Your loss is probably exploding. Try lowering the learning rate\n", "diverged"),
        ("    sock.connect(sa)\nTimeoutError: timed out\n", "io_error"),
        (
            "WARNING: One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are"
            " waiting for remainder of ranks for more than 60 seconds.\n",
            "stalled",
        ),
        ("2020-09-25 18:44:31,000-INFO: iter: 10, lr: 0.000040, 'loss': '43.708477', eta: 8:12:32\n", "progressing"),
        (
            "Training progress: 100%|████████| 50000/50000 [1:10:02<00:00, 11.90it/s, Loss=0.0540809]\n\n"
            "[ITER 50000] Saving Gaussians [31/08 23:48:12]\n",
            "completed",
        ),
        ("[2021-05-04 16:54:52,408 PID:3860 INFO logger.py info] Experiment done\n", "completed"),
        (
            "Epoch 1: train_perplexity=1.2784, train_epoch_loss=0.2456\n"
            "max training steps reached, stopping training, total_train_steps:  6\n",
            "completed",
        ),
        (
            "[LightGBM] [Info] Iteration:1000, training's log loss: 0.004583\n[LightGBM] [Info] Finish train\n",
            "completed",
        ),
        ("| Trial name | status | iter |\n|---|---|---|\n| PPO_Env_9f072_00000 | RUNNING  |    118 |\n", "progressing"),
        (
            "200:    learn: 13.18  test: 20.26  best: 20.16 (152)  total: 2.56s  remaining: 1m 1s\nbestTest = 20.16991839\n"
            "bestIteration = 152\nShrink model to first 250 iterations. (min iterations for best model = 250)\n",
            "completed",
        ),
        ("Runned 10 times\nAverage val accuracy: 0.7374911606311798 \u00b1 0.0011984726866040361\n", "completed"),
        ("2021-02-24-04-39: epoch: 6 |tot 4.982389 | hm 0.703464 | wh 1.402448 | time 114.166667 | \n", "progressing"),
        # The shell's "Killed" lands at the cursor, after a bar that ended without a newline.
        (" 31%|███▌      | 331/1063 [01:06<03:59,  3.06it/s]Killed\n", "oom"),
        (
            "Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1 "
            "(world_size=4, worker_count=16, timeout=0:01:00)\n",
            "stalled",
        ),
        (
            "mean ar error (without repeats): nan\nNo data found. Please verify arguments (train_data_dir must be the "
            "parent of folders with images)\n",
            "data_error",
        ),
        (
            "tensorflow.python.framework.errors_impl.InvalidArgumentError: logits and labels must be broadcastable: "
            "logits_size=[451801,7] labels_size=[451248,7]\n",
            "data_error",
        ),
        ("76950 2.596339\n76960 2.735384\n76970 2.6265104\n76980 nan\n76990 nan\nSaving the model\n", "diverged"),
        (
            'algo-1  | {"simapp_exception": {"function": "save_to_store", "message": "Exception [Failed to upload '
            "/opt/ml/code/checkpoint/0_Step-0.ckpt.data-00000-of-00001 to bucket/rl-deepracer",
            "io_error",
        ),
        (
            "xgboost.core.XGBoostError: [17:19:30] src/objective/multiclass_obj.cc:75:\nCheck failed: label_error >= 0\n"
            "SoftmaxMultiClassObj: label must be in [0, num_class), num_class=10 but\nfound 10 in label.\n",
            "data_error",
        ),
        (
            'luajit: [string "argcheck"]:9237:\nA dataset class for object detection.\n\ninvalid arguments!\n'
            "stack traceback:\n    [C]: in function 'error'\n",
            "data_error",
        ),
        (
            "INFO:root:[Epoch 0][Batch 0], Speed: 2.362 samples/sec, CrossEntropy=18.623, SmoothL1=4.061\n"
            "INFO:root:[Epoch 0][Batch 1], Speed: 10.102 samples/sec, CrossEntropy=nan, SmoothL1=nan\n",
            "diverged",
        ),
        (
            "PermissionError: [WinError 32] The process cannot access the file because it is being used by another "
            "process: '1719.pth' -> 'GPT_weights/e15.ckpt'\n",
            "io_error",
        ),
        (
            "Downloading https://ultralytics.com/assets/Arial.ttf to C:\\Users\\me\nurllib.error.URLError: <urlopen error "
            "[WinError 10060] A connection attempt failed>\n",
            "io_error",
        ),
        (
            "INFO:root:Epoch[6] Batch [450]  Speed: 492.58 samples/sec       accuracy=0.480291\n"
            "INFO:root:Epoch[6] Batch [460]  Speed: 528.04 samples/sec       accuracy=0.480422\n",
            "progressing",
        ),
        (
            "[ERROR] Reason: The Notify register has not received the Notify record from remote rank: [24]. "
            "(default 1800s, You can set the interval by using HCCL_EXEC_TIMEOUT.)\n",
            "stalled",
        ),
        (
            '  File ".../stochastic_depth.py", line 41, in stochastic_depth\n    noise = noise.bernoulli_(survival_rate)\n'
            "RuntimeError: UR error\n",
            "cuda_fault",
        ),
        (
            "[1660]\tcv_agg's l1: 0.598639\n[LightGBM] [Warning] No further splits with positive gain, best gain: -inf\n"
            "[1680]\tcv_agg's l1: 0.598635\n",
            "progressing",
        ),
        (
            "[LightGBM] [Info] Iteration:43, valid_1 auc : 0.81749\n[LightGBM] [Info] 0.229720 seconds elapsed, finished "
            "iteration 43\n[LightGBM] [Warning] No further splits with positive gain, best gain: -inf\n",
            "progressing",
        ),
        (
            "2017-09-08 03:21:23,778 [steps/libs/nnet3/train/chain_objf/acoustic_model.py:301 - train_one_iteration - "
            "INFO ] On iteration 221, learning rate is 0.00169775612772.\n",
            "progressing",
        ),
        (
            "  0%|▋      | 100/24128 [00:40<2:39:03,  2.52it/s][2021-11-27 00:36:55,985] [INFO] [stage2.py:1628:step] "
            "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1\n"
            "  0%|▋      | 101/24128 [00:41<2:39:00,  2.52it/s]\n",
            "diverged",
        ),
        (
            "train: WARNING  C:\\yolo\\train\\images\\s12.png: ignoring corrupt image/label: Label class 3 exceeds dataset "
            "class count 1. Possible class labels are 0-0\n",
            "data_error",
        ),
        (
            "ml.dmlc.xgboost4j.java.XGBoostError: [21:47:23] /src/objective/regression_obj.cu:66: Check failed: "
            "preds.Size() == info.labels_.Size() (13026 vs. 6513) : labels are not correctly provided\n",
            "data_error",
        ),
        (
            "tensorflow.python.framework.errors_impl.InvalidArgumentError: Found Inf or NaN global norm. : Tensor had NaN "
            "values\n\t [[{{node VerifyFinite/CheckNumerics}} = CheckNumerics[T=DT_FLOAT]]]\n",
            "diverged",
        ),
        (
            "Epoch 10/10\n70/70 [==============================] - 7s 99ms/step - loss: 0.0863 - accuracy: 0.9735\n"
            "2020-06-08 05:30:15.889706: W tensorflow/core/kernels/data/generator_dataset_op.cc:103] Error occurred when "
            "finalizing GeneratorDataset iterator: Cancelled: Operation was cancelled\n",
            "completed",
        ),
    ],
)
def test_how_real_logs_print_these(text: str, state: str) -> None:
    assert classify(text).state == state


def test_a_scaler_at_its_floor_is_diverged_but_one_above_it_is_not() -> None:
    """DeepSpeed at `min_loss_scale` (1) and still overflowing skips every step; an ordinary overflow
    that halves the scale from 65536 is what fp16 runs print all the time."""
    at_floor = "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1\n"
    routine = "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
    step = "{'loss': 0.91, 'grad_norm': 1.2, 'learning_rate': 2e-05, 'epoch': 0.1}\n"
    assert classify(at_floor).state == "diverged"
    assert classify(routine + step).state == "progressing"


def test_a_bare_step_value_log_is_diverged_only_when_it_stays_nan() -> None:
    """`print(step, loss)` logs: NaN for the last two rows after finite ones; not one NaN that
    recovered, not a table cell, not a log too short to have a trend."""
    rows = "".join(f"{s} {2.7 - s / 1e5:.4f}\n" for s in range(76900, 76980, 10))
    assert classify(rows + "76980 nan\n76990 nan\n").state == "diverged"
    assert classify(rows + "76980 nan\n76990 2.61\n").state != "diverged"
    assert classify("0 nan\n1 nan\n").state != "diverged"
    assert classify(rows + "76980 nan\n100 nan\n").state != "diverged"  # steps went back: not one series
    waiting = "Waiting in store based barrier to initialize process group for rank: 0, key: k (world_size=2)\n"
    assert (
        classify(waiting + "{'loss': 0.91, 'grad_norm': 1.2, 'learning_rate': 2e-05, 'epoch': 0.1}\n").state
        == "progressing"
    )


@pytest.mark.parametrize(
    "text",
    [
        "[INFO:swift] last_model_checkpoint: /out/v0/checkpoint-93\n[INFO:swift] End time of running main: 2024-06-07 10:18:41.386561\n",
        "Iter 1000: Saved adapter weights to adapters/adapters.safetensors and adapters/0001000_adapters.safetensors.\n"
        "Saved final weights to adapters/adapters.safetensors.\n",
        "step:200 - critic/score/mean:0.8 - actor/pg_loss:0.01\nFinal validation metrics: {'val/test_score/gsm8k': 0.72}\n",
    ],
)
def test_how_frameworks_print_the_end_of_a_run(text: str) -> None:
    """ms-swift after main() returns, mlx-lm after its loop, verl on its last step (their sources print these)."""
    assert classify(text).state == "completed"


def test_the_last_epoch_run_to_its_end_is_a_finished_run() -> None:
    """The epoch counter at the run's epoch count with a full bar after it (Keras, tqdm loops); not
    a last epoch still running, not an earlier epoch's full bar, not a later fold starting over."""
    keras = (
        "Epoch 9/10\n1875/1875 [==============================] - 5s 3ms/step - loss: 0.0401 - val_loss: 0.0731\n"
        "Epoch 10/10\n"
    )
    done = keras + "1875/1875 [==============================] - 5s 3ms/step - loss: 0.0312 - val_loss: 0.0712\n"
    assert (v := classify(done)).state == "completed" and v.rule == "final-epoch-done"
    assert (
        classify(keras + " 500/1875 [=======>......................] - ETA: 3s - loss: 0.0330\n").state == "progressing"
    )
    assert classify(done.replace("Epoch 10/10", "Epoch 10/12")).state == "progressing"
    assert (
        classify(done + "Fold 2/5\nEpoch 1/10\n 12/1875 [..............................] - ETA: 9s - loss: 2.3\n").state
        == "progressing"
    )
    bar = "Train epoch [1/1]: 100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588| 1000/1000 [1:00:00<00:00, rm_loss=0.12]\n"
    assert classify(bar).state == "completed"
    assert classify(bar.replace("100%", " 45%").replace("1000/1000", "450/1000")).state == "progressing"
    assert classify(done + "torch.OutOfMemoryError: CUDA out of memory.\n").state == "oom"
    assert classify(done, idle_seconds=5000).state == "stalled"  # a finished run's log stands still too: idle decides


@pytest.mark.parametrize(
    "text",
    [
        "[host] 2020-09-17 18:14:28,068 (trainer:322) INFO: The training was finished at 1 epochs \n",  # ESPnet
        "ppl: 2.31\nsaving the final model ...\n",  # DeepSpeed-Chat
        "fps step: 51234 fps total: 49012 epoch: 5000/5000\nMAX EPOCHS NUM!\n",  # rl_games
        "Test: [  78/78]  Acc@1: 80.0 (80.1)\n*** Best metric: 80.124 (epoch 299)\n",  # timm
        " 32    4800        927.07        2457.63    94.61      84.76    0.90\n\u2714 Saved pipeline to output directory\n"
        "spacy_model/model-last\n",  # spaCy
        "train completed, best_metric: 0.9123 at epoch: 40\n",  # MONAI
        "PEFT modules are saved in /out directory\nKey: avg_train_prep, Value: 1.1131309270858765\n"
        "Key: avg_train_loss, Value: 0.1071767508983612\n",  # llama-recipes, what train() returned
        "Epoch [5/5], Step [500/600], Loss: 0.0412\nEpoch [5/5], Step [600/600], Loss: 0.0391\n",  # counters at their totals
        "I0728 00:22:59.593644 24418 solver.cpp:481]     Test net output #0: accuracy = 0.768236\n"
        "I0728 00:22:59.593730 24418 solver.cpp:411] Optimization Done.\n"
        "I0728 00:22:59.593740 24418 caffe.cpp:187] Optimization Done.\n",  # Caffe
        "Iteration 2000, loss = 0.0421\nOptimization Done.\n",  # Caffe's solver under DIGITS (no glog prefix)
        "Epoch: 0200 loss_train: 0.4012 acc_train: 0.9357 loss_val: 0.6877 acc_val: 0.8067 time: 0.0045s\n"
        "Optimization Finished!\nTotal time elapsed: 2.3010s\n",  # pygcn / pyGAT
        "INFO:tensorflow:Saving checkpoints for 1000 into /tmp/model/model.ckpt.\n"
        "INFO:tensorflow:Loss for final step: 0.1834.\n",  # TF Estimator
        "{'train_runtime': 812.3, 'train_loss': 0.913, 'epoch': 3.0}\n100%|\u2588\u2588\u2588\u2588| 948/948 [13:32<00:00]\n"
        "***** Running Evaluation *****\n  Num examples = 500\n100%|\u2588\u2588\u2588\u2588| 63/63 [00:10<00:00,  6.00it/s]\n"
        "***** eval metrics *****\n  epoch                   =        3.0\n  eval_loss               =     0.4561\n",  # HF scripts
        "08/29/2021 08:29:05 - INFO - __main__ -   ***** Eval results *****\n"
        "08/29/2021 08:29:05 - INFO - __main__ -     epoch = 1.0\n",  # the older example scripts, SimCSE
        "Train:  99%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u258a| 80/81 [4:49:11<03:36, 216.89s/it]\n"
        "[INFO:swift] last_model_checkpoint: /out/v6-20250609-104706/checkpoint-80\n"
        "[INFO:swift] best_model_checkpoint: None\n",  # ms-swift after train()
    ],
)
def test_more_ends_of_runs_as_their_sources_print_them(text: str) -> None:
    assert classify(text).state == "completed"


@pytest.mark.parametrize(
    ("text", "state"),
    [
        # hand-written loops print one epoch's end every epoch
        ("Training completed for epoch 3\nTraining accuracy for epoch 3: 0.91\n", "progressing"),
        ("Rank 0 training done for epoch 2\n", "progressing"),
        ("One epoch training finished, starting evaluation...\n", "progressing"),
        # llama-recipes' bar says "completed" on every step; its epoch 2 of 3 with the step counted from 0
        (
            "Training Epoch: 2/3, step 49/50 completed (loss: 1.03): 100%|\u2588\u2588\u2588\u2588| 50/50 [09:01<00:00, 10.82s/it]\n",
            "progressing",
        ),
        (
            "Training Epoch: 3/3, step 49/50 completed (loss: 1.03): 100%|\u2588\u2588\u2588\u2588| 50/50 [09:01<00:00, 10.82s/it]\n",
            "completed",
        ),
        (
            "[Epoch 16/30, Batch 4410/7329] [Losses: x 0.008723, y 0.008725, total 0.053949, recall: 0.62105]\n",
            "progressing",
        ),
        ("[Epoch 29/30, Batch 7328/7329] [Losses: x 0.14, total 1.33, recall: 0.41]\n", "progressing"),  # from 0 or 1?
        (
            "INFO:mlagents.trainers: FindTheTarget: Step: 44000. Time Elapsed: 143.938 s Mean Reward: 0.400. Training.\n",
            "progressing",
        ),
        # Vertex AI tags a job's whole stderr ERROR: the severity column is not an error word
        (
            "ERROR   2022-01-26 14:19:34 +1100       workerpool0-0    31%|###       | 5974/19120 [31:21<59:25,  3.69it/s]\n"
            "ERROR   2022-01-26 14:19:41 +1100       workerpool0-0   Configuration saved in /tmp/ckpt-6000/config.json\n",
            "progressing",
        ),
    ],
)
def test_what_only_looks_like_the_end_of_a_run_or_an_error(text: str, state: str) -> None:
    v = classify(text)
    assert (v.guess if v.state == UNSURE else v.state) == state


def test_a_full_bar_over_the_runs_steps_is_a_finished_run() -> None:
    """diffusers' and kohya's scripts name their whole-run bar "Steps"; a bar that logs "Step N" at its
    own N counts steps too. A full bar of anything else is one epoch's end, and a part-full one runs."""
    kohya = "steps: 100%|\u2588\u2588\u2588\u2588\u2588\u2588| 1600/1600 [1:02:03<00:00,  2.33s/it, avr_loss=0.0812]\n"
    assert (v := classify(kohya)).state == "completed" and v.rule == "final-epoch-done"
    assert classify(kohya.replace("100%", " 45%").replace("1600/1600", "720/1600")).state == "progressing"
    assert classify(kohya.replace("steps:", "epoch 1:")).state == "progressing"
    assert classify(kohya.replace("steps:", "max_steps:")).state == "progressing"
    logged = (
        "100%|\u2588\u2588\u2588\u2588| 55000/55000 [37:14:35<00:00,  2.44s/it] INFO | >> Step 55000, "
        "Loss: {'action_loss': 0.0082}\n"
    )
    assert classify(logged).state == "completed"
    assert classify(logged.replace("Step 55000", "Step 54000")).state == "progressing"


def test_science_codes_nan_tables_are_diverged_and_their_closing_summaries_end_a_run() -> None:
    """DeepXDE prints its best model when train() returns, also after the losses went NaN; DiffDock's and
    chemprop's summaries after their loops end a run too, but never outrank a failure before them."""
    table = (
        "Step      Train loss    Test loss     Test metric\n"
        "0         [5.47e+03]    [6.44e+03]    [1.00e+00]\n1000      [2.11e+01]    [2.52e+01]    [3.10e-01]\n"
    )
    summary = "\nBest model at step 1000:\n  train loss: 2.11e+01\n  test loss: 2.52e+01\n"
    assert classify(table + summary).state == "completed"
    nan = table + "2000      [nan]         [nan]         [nan]\n3000      [nan]         [nan]         [nan]\n"
    assert (v := classify(nan + summary)).state == "diverged" and v.rule == "nan-table-row"
    partly = classify(table + "2000      [1.2e+01, nan]    [1.3e+01, 2.0e+00]    [nan]\n")  # one NaN term, not the run
    assert partly.state != "diverged" and partly.guess == "progressing"
    diffdock = "Epoch 399: Val inference rmsds_lt2 0.000\nBest Validation Loss 0.578 on Epoch 387\n"
    assert classify(diffdock).state == "completed"
    chemprop = (
        "Epoch 29\nLoss = 1.2345e-01, PNorm = 35.1, GNorm = 0.41, lr_0 = 1.0000e-04\nValidation rmse = 0.712\n"
        "Model 0 best validation rmse = 0.698412 on epoch 24\nModel 0 test rmse = 0.731200\n"
    )
    assert classify(chemprop).state == "completed"
    assert (
        classify(
            "1-fold cross validation\n\tSeed 0 ==> test rmse = 0.731200\n"
            "Overall test rmse = 0.731200 +/- 0.000000\nElapsed time = 0:05:12\n"
        ).state
        == "completed"
    )
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert classify(oom + "Model 0 best validation rmse = 0.698412 on epoch 24\n").state == "oom"


def test_the_shells_time_report_is_completion_only_with_no_failure_before_it() -> None:
    """`time python train.py` ends every run with real/user/sys, a crashed one too."""
    report = "real\t0m46.551s\nuser\t0m40.530s\nsys\t0m6.819s\n"
    assert classify("Train Loss: 0.1529 | Train Acc: 0.945\nTest Acc: 0.963\n" + report).state == "completed"
    crash = "Traceback (most recent call last):\n  File \"train.py\", line 9\nKeyError: 'label'\n"
    assert classify(crash + report).state == "data_error"
    assert classify(" 31%|\u2588\u2588\u2588      | 331/1063 [01:06<03:59,  3.06it/s]Killed\n" + report).state == "oom"
    assert classify("real world accuracy: 0.9\n").state != "completed"


@pytest.mark.parametrize(
    ("text", "state"),
    [
        (
            "2022-05-07 17:08:19,966 - mmseg - INFO - Iter [200/40000]  lr: 7.920e-06, decode.loss_seg: nan, "
            "decode.acc_seg: 42.4247\n",
            "diverged",
        ),
        ("Iter [200/40000]  lr: 7.920e-06, loss_scale: inf, loss: 0.4321\n", "progressing"),  # the scale is no loss
        (
            "Region 82 Avg IOU: nan, Class: nan, Obj: nan, No Obj: nan, .5R: 0.000000, .75R: 0.000000,  count: 2\n",
            "diverged",
        ),
        (
            "Region 106 Avg IOU: -nan, Class: -nan, Obj: -nan, No Obj: 0.000012, .5R: -nan, .75R: -nan,  count: 0\n"
            "Region 82 Avg IOU: 0.612, Class: 0.98, Obj: 0.71, No Obj: 0.004, .5R: 0.75, .75R: 0.25,  count: 4\n"
            "1: 1104.32, 1104.32 avg loss, 0.000000 rate, 3.21 seconds, 64 images\n",
            "progressing",
        ),  # 0/0 where count is 0
        (
            "WARNING: tokenization mismatch: 204 vs. 218. (ignored)\nWARNING: tokenization mismatch: 385 vs. 399. (ignored)\n",
            "data_error",
        ),
        # the watchdog's "failed or timed out" line gives way to the NCCL error that says which
        (
            "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
            "CUDA kernels ... what(): NCCL error: remote process exited or there was a network error, NCCL version 2.14.3\n"
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n",
            "cuda_fault",
        ),
        (
            "[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
            "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n",
            "stalled",
        ),
        # XLA's allocator, on TPU and GPU: the "memory" is past the words the older pattern allowed
        (
            "E external/org_tensorflow/tensorflow/compiler/xla/pjrt/pjrt_stream_executor_client.cc:2085] Execution of "
            "replica 0 failed: RESOURCE_EXHAUSTED: Attempting to reserve 11.35G at the bottom of memory. That was not "
            "possible. There are 12.18G free, 0B reserved, and 10.52G reservable.\n",
            "oom",
        ),
        (
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to "
            "allocate 50.00M. That was not possible. There are 27.86M free.; (0x0x0_HBM0)\n",
            "oom",
        ),
        # transformers gave up fetching a Hub id's files (the network) ...
        (
            "OSError: Can't load tokenizer for 'openai/clip-vit-large-patch14'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the same name.\n",
            "io_error",
        ),
        (
            "OSError: Can't load the configuration of 'Qwen/Qwen3-Embedding-0.6B'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the same name.\n",
            "io_error",
        ),
        # ... but a local path without the files is the user's setup
        (
            "OSError: Can't load tokenizer for './models/clip-vit-large-patch14'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the same name.\n",
            "data_error",
        ),
        (
            "OSError: Can't load tokenizer for '/data/ckpt/run3/checkpoint-500'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the same name.\n",
            "data_error",
        ),
        (
            "ERROR: error code -9\n\nStarting Optimization\nIteration 0, Testing net (#0)\n"
            "Test net output #0: loss_bbox = 18.4677 (* 2 = 36.9353 loss)\n",
            "oom",
        ),  # DIGITS: SIGKILL, posted first
        # gradient boosting's own errors: device memory, no device, and checks on the data it was given
        (
            "xgboost.core.XGBoostError: [10:31:12] ../src/common/device_helpers.cuh:431: Memory allocation error on "
            "worker 0: std::bad_alloc: cudaErrorMemoryAllocation: out of memory\n",
            "oom",
        ),
        (
            "xgboost.core.XGBoostError: [10:31:12] ../src/gbm/gbtree.cc:534: Check failed: common::AllVisibleGPUs() >= 1 "
            "(0 vs. 1) : No visible GPU is found for XGBoost.\n",
            "cuda_fault",
        ),
        (
            "xgboost.core.XGBoostError: [10:31:12] ../src/data/data.cc:492: Check failed: labels_.Size() == num_row_ "
            "(1000 vs. 999) : Size of labels must equal to number of rows.\n",
            "data_error",
        ),
        (
            "_catboost.CatBoostError: catboost/private/libs/target/data_providers.cpp:639: Target contains only one "
            "unique value\n",
            "data_error",
        ),
        # Hydra could not compose the run's config; torch.load read a file cut short
        ("hydra.errors.MissingConfigException: In 'train': Could not find 'model/resnet99'\n", "data_error"),
        ("RuntimeError: unexpected EOF, expected 3718471 more bytes. The file might be corrupted.\n", "io_error"),
        (
            "model-00001-of-00005.safetensors:   1%|1         | 52.4M/4.00G [01:22<1:43:27, 635kB/s]\nError running job: An "
            "error occurred while downloading using `hf_transfer`. Consider disabling HF_HUB_ENABLE_HF_TRANSFER for better "
            "error handling.\n",
            "io_error",
        ),  # huggingface_hub
        (
            '    self._save_checkpoint(model, trial, metrics=metrics)\n  File "/usr/lib/python3.9/shutil.py", line 720, in '
            "rmtree\n    os.rmdir(path)\nFileNotFoundError: [Errno 2] No such file or directory: '/ckpt/tmp-checkpoint-1'\n",
            "io_error",
        ),  # the Trainer's staging dir, gone while it saved (multi-node, shared disk)
        (
            "FileNotFoundError: [Errno 2] No such file or directory: 'out/checkpoint-500/trainer_state.json'\n",
            "data_error",
        ),  # resuming from a checkpoint that is not there: the user's path
        (
            "x:430:2237 [0] include/topo.h:27 NCCL WARN Could not find real path of /sys/class/pci_bus/0000:02/../../0000:02:00.0\n"
            "x:430:2237 [0] NCCL INFO init.cu:864 -> 2\nTraceback (most recent call last):\n"
            '  File "ddp.py", line 55, in <module>\n',
            "cuda_fault",
        ),  # NCCL's topology probe at init
        # a script's own check on the loss, and an RL policy's std gone NaN
        (
            "  File \"solver.py\", line 100, in train\n    raise ValueError(' [x] nan loss ')\nValueError:  [x] nan loss\n",
            "diverged",
        ),
        (
            "    return torch.normal(self.loc.expand(shape), self.scale.expand(shape))\n"
            "RuntimeError: normal expects all elements of std >= 0.0\n",
            "diverged",
        ),
    ],
)
def test_failures_as_these_stacks_print_them(text: str, state: str) -> None:
    assert classify(text).state == state


def test_the_runs_step_counter_at_its_total_is_a_finished_run() -> None:
    """LLaMA-Factory's trainer_log (its last entry has "loss": null) and ms-swift's log lines."""
    entry = (
        '{{"current_steps": {n}, "total_steps": 3235, "loss": {loss}, "learning_rate": 1e-08, "epoch": 1.0, '
        '"percentage": 99.9, "elapsed_time": "5:16:48", "remaining_time": "0:00:01"}}\n'
    )
    assert classify(entry.format(n=3230, loss="4.4598") + entry.format(n=3235, loss="null")).state == "completed"
    assert classify(entry.format(n=3220, loss="4.4458") + entry.format(n=3230, loss="4.4598")).state == "progressing"
    swift = (
        "{{'loss': 0.412, 'acc': 0.87, 'grad_norm': 1.3, 'learning_rate': 1e-06, 'epoch': 3.0, "
        "'global_step/max_steps': '{n}/1200', 'percentage': '99.9%', 'elapsed_time': '2h', 'remaining_time': '1s'}}\n"
    )
    assert classify(swift.format(n=1200)).state == "completed"
    assert classify(swift.format(n=1199)).state == "progressing"
    assert classify(entry.format(n=0, loss="null").replace("3235", "0")).state != "completed"


def _said(text: str, idle: float | None = None) -> str:
    v = classify(text, idle_seconds=idle)
    return v.guess if v.state == UNSURE else v.state


def test_log2_loss_scales_logger_tables_sagemaker_ends_and_empty_datasets_as_their_sources_print_them() -> None:
    """Each reading as the framework's own format prints it (a log2 fp16 scale, a logger table's loss
    row, burn's metrics, a raised NaN check, SageMaker's end of job, an empty dataset, corrupt labels),
    with the near miss beside it that must not change."""
    step = "{'loss': 0.91, 'grad_norm': 1.2, 'learning_rate': 2e-05, 'epoch': 0.1}\n"
    # guided-/improved-diffusion's fp16 scaler keeps log2 of the scale: below 0 the scale is below 1
    assert _said("Found NaN, decreased lg_loss_scale to -3.0\n" * 3) == "diverged"
    assert _said("Found NaN, decreased lg_loss_scale to 19.0\n" + step) == "progressing"
    # OpenAI baselines' logger table; its loss-scale row is no loss
    table = "-------------------------\n| grad_norm | 0.41 |\n| loss | {v} |\n| step | 1.2e+04 |\n-------------------------\n"
    assert _said(table.format(v="nan")) == "diverged"
    assert _said("| lg_loss_scale | -1.62e+04 |\n" + table.format(v="0.0132")) == "progressing"
    # burn's metrics: the loss given with what it is averaged over
    assert _said("  - Train Loss: epoch NaN - batch NaN\n  - Iteration 1422 Epoch 2/6\n") == "diverged"
    assert _said("  - Train Loss: epoch 0.52 - batch 0.48\n") != "diverged"
    # a check raising on a tensor gone NaN
    assert (
        _said('    raise ValueError("cls_logits is NaN or Inf.")\nbuiltins.ValueError: cls_logits is NaN or Inf.\n')
        == "diverged"
    )
    assert _said("ValueError: Input contains NaN, infinity or a value too large for dtype('float64').\n") != "diverged"
    # SageMaker: the training toolkit's report, and the SDK's job log stream at the end of a completed job
    assert _said("2020-04-15 05:51:54,719 sagemaker-containers INFO     Reporting training SUCCESS\n") == "completed"
    assert (
        _said("2021-03-02 10:11:12 Completed - Training job completed\nTraining seconds: 104\nBillable seconds: 104\n")
        == "completed"
    )
    assert _said("2020-04-15 05:51:54,719 sagemaker-containers ERROR    Reporting training FAILURE\n") != "completed"
    # a dataset with nothing in it; but not a count of nothing skipped, nor ten of something
    assert (
        _said("INFO | data_module:139 - PreprocessedTensorDataset: 0 samples cached in RAM from ./ds\n") == "data_error"
    )
    assert _said("Found 0 images belonging to 3 classes.\n") == "data_error"
    assert _said("Found 10 images belonging to 3 classes.\n") != "data_error"
    assert _said("Filtered 0 samples with empty text.\n" + step) == "progressing"
    # ultralytics' dataset scan: corrupt labels decide only when training never went on
    corrupt = "train: WARNING ⚠️ /data/images/train/{i}.jpg: ignoring corrupt image/label: cannot reshape array of size 55 into shape (2)\n"
    assert _said("".join(corrupt.format(i=i) for i in range(5))) == "data_error"
    bar = "      1/100      3.51G      1.234      2.345      1.456         12        640:  45%|████▌     | 9/20 [00:04<00:05,  2.1it/s]\n"
    assert _said(corrupt.format(i=1) + bar) == "progressing"


def test_a_tf_estimator_evaluation_written_out_after_training_is_a_finished_run() -> None:
    """BERT's run_classifier (and its forks) evaluate after training and write one sorted `key = value`
    line per metric; the same lines without global_step or without an eval_ key are not that."""
    block = (
        "***** Eval results *****\n  eval_accuracy = 0.91\n  eval_loss = 0.27\n  global_step = 78750\n  loss = 0.27\n"
    )
    assert _said(block) == "completed"
    assert _said(block.replace("***** Eval results *****\n", "")) == "completed"
    assert (
        _said(
            "INFO:tensorflow:  eval_accuracy = 0.91\nINFO:tensorflow:  eval_loss = 0.27\n"
            "INFO:tensorflow:  global_step = 1200\nINFO:tensorflow:  loss = 0.27\n"
        )
        == "completed"
    )
    assert _said("  eval_accuracy = 0.91\n  eval_loss = 0.27\n  loss = 0.27\n") == "progressing"
    assert _said("  lr = 0.001\n  global_step = 500\n  loss = 0.27\n") == "progressing"


def test_nccl_error_trails_store_timeouts_and_blown_up_gradient_norms() -> None:
    """NCCL's error trail, a c10d store's timeout and a blown-up gradient norm as NCCL, c10d and the HF
    Trainer print them, each with its near miss."""
    # NCCL's error trail ("file.cc:line -> result" for a non-zero result) and its bootstrap's refused connect
    trail = (
        "h1:941227:943077 [0] NCCL INFO Call to connect returned Connection refused, retrying\n"
        "h1:941227:943077 [0] include/socket.h:390 NCCL WARN Connect to 10.0.0.2<21724> failed : Connection refused\n"
        "h1:941227:943077 [0] NCCL INFO bootstrap.cc:100 -> 2\nh1:941227:943077 [0] NCCL INFO init.cc:695 -> 2\n"
    )
    assert _said(trail) == "cuda_fault"
    assert (
        _said(
            "h1:1:2 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\nh1:1:2 [0] NCCL INFO init.cc:1390 -> 0\n"
            "{'loss': 0.91, 'grad_norm': 1.2, 'learning_rate': 2e-05, 'epoch': 0.1}\n"
        )
        == "progressing"
    )
    # a c10d store's get timing out: a peer never wrote its key
    assert (
        _said(
            "RuntimeError: [1] is setting up NCCL communicator and retreiving ncclUniqueId from [0] via c10d "
            "key-value store by key '0', but store->get('0') got error: Timeout waiting for key: default_pg/0/0 "
            "after 1800000 ms\n"
        )
        == "stalled"
    )
    # a project's own NaN check, raised without a space after the colon
    assert _said("ValueError:Network outputs is NAN! Stop Training\n") == "diverged"
    # the gradient norm: sustained at a hundredfold its low, or past 1e10; one spike at the end is no divergence
    row = "{{'loss': 11.2, 'grad_norm': {g}, 'learning_rate': 2.5e-05, 'epoch': 0.0}}\n"
    assert _said("".join(row.format(g=g) for g in (3.1, 2.8, 3.0, 4e4, 9e4, 2.1e5))) == "diverged"
    assert _said("".join(row.format(g=g) for g in (3.8e12, 5.7e12, 8.5e12, 1.3e13))) == "diverged"
    assert _said("".join(row.format(g=g) for g in (3.1, 2.8, 3.0, 2.9, 3.3, 5e4))) == "progressing"
    assert _said("".join(row.format(g=g) for g in (310.0, 280.0, 300.0, 2900.0, 3300.0, 5000.0))) == "progressing"


def test_the_other_cuda_libraries_failures_and_recboles_closing_results() -> None:
    """cuFFT/cuSOLVER/cuRAND/cuSPARSE internal failures are device faults (their
    allocation failures are oom), and RecBole's closing 'best valid' ends a run unless a failure came before it."""
    frames = '  File "mel_processing.py", line 104, in mel_spectrogram_torch\n    spec = torch.stft(y, n_fft)\n'
    assert _said(frames + "RuntimeError: cuFFT error: CUFFT_INTERNAL_ERROR\n") == "cuda_fault"
    assert (
        _said("RuntimeError: cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR, when calling `cusolverDnCreate(handle)`\n")
        == "cuda_fault"
    )
    assert _said(frames + "RuntimeError: cuFFT error: CUFFT_ALLOC_FAILED\n") == "oom"
    end = (
        "26 May 19:28    INFO  best valid : OrderedDict([('recall@10', 0.746), ('ndcg@10', 0.4888)])\n"
        "26 May 19:28    INFO  test result: OrderedDict([('recall@10', 0.7131), ('ndcg@10', 0.4631)])\n"
    )
    assert _said(end) == "completed"
    assert _said("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n" + end) == "oom"
    assert (
        _said(
            "26 May 19:20    INFO  epoch 3 evaluating [time: 1.2s, valid_score: 0.41]\n"
            "26 May 19:20    INFO  valid result: recall@10 : 0.74    ndcg@10 : 0.48\n"
            "26 May 19:21    INFO  epoch 4 training [time: 30.1s, train loss: 5108.2]\n"
        )
        != "completed"
    )


def test_a_shells_kill_report_after_a_bar_nccls_refused_call_and_keras_download_failures() -> None:
    """Bash's report of a killed child after a bar, NCCL refusing a call and Keras' download failures,
    each in its general form, with the near miss beside it."""
    bar = "Epoch 15 (validation) acc=1.0:   2%|#4        | 20/1094 [00:41<11:04,  1.62it/s]"
    # bash's report of a child killed by SIGKILL (the OOM killer), where the bar left the cursor
    assert _said(bar + '/opt/bin/jac-crun: line 6:  3305 Killed                  $ROOT/bin/jac-run "$@"\n') == "oom"
    assert _said(bar + "\nline 6 of the config: Killed processes are restarted\n" + bar + "\n") == "progressing"
    # NCCL refusing a call: its "Last error" detail speaks of its own config, not the user's
    nccl = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, "
        "invalid argument, NCCL version 2.16.5\nncclInvalidArgument: Invalid value for an argument.\nLast error:\n"
        "Invalid config blocking attribute value -2147483648\n"
    )
    assert _said(nccl) == "cuda_fault"
    assert _said("yaml.scanner.ScannerError: mapping values are not allowed here\n") == "data_error"
    # Keras' get_file when the download fails, and a script's own words for it
    assert (
        _said(
            'Traceback (most recent call last):\n  File "babi_rnn.py", line 150, in <module>\nException: URL fetch '
            "failure on http://example.org/tasks.tar.gz: None -- Forbidden\n"
        )
        == "io_error"
    )
    assert _said("Error downloading dataset, please download it manually:\n") == "io_error"
    assert (
        _said(
            'Traceback (most recent call last):\n  File "fetch.py", line 3, in <module>\nValueError: URL is not '
            "a valid dataset path: data/tasks.tar.gz\n"
        )
        != "io_error"
    )
    # a peer's failure reaching this rank stays below a data error found before it
    assert (
        _said(
            "ValueError: Invalid config: unknown key 'lora_rank'\ntorch.distributed.DistBackendError: NCCL error in: "
            "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, remote process exited or there was a network "
            "error, NCCL version 2.18.1\nncclRemoteError: A call failed possibly due to a network error.\n"
        )
        == "data_error"
    )


def test_a_closing_final_scores_line_and_tensorflows_allocator_dump() -> None:
    """A script's closing scores line ends a run (numbers only, and
    only with no failure before it), and TensorFlow's allocator dump is an out-of-memory."""
    iters = "Iter   UAS        POS\n0:\t64.251\t90.546\n14:\t80.390\t95.933\n\n                UAS         LAS         POS\n"
    assert _said(iters + "Final:\t84.881\t81.538\t96.845\n") == "completed"
    assert _said(iters + "Final: loss nan\n") != "completed"
    assert (
        _said(
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            + iters
            + "Final:\t84.881\t81.538\t96.845\n"
        )
        == "cuda_fault"
    )
    dump = (
        "2020-06-15 13:25:26.120856: I tensorflow/core/common_runtime/bfc_allocator.cc:917] 1 Chunks of size "
        "221800704 totalling 211.53MiB\n2020-06-15 13:25:26.120889: I tensorflow/core/common_runtime/"
        "bfc_allocator.cc:921] Sum Total of in-use chunks: 10.05GiB\n"
    )
    assert _said(dump) == "oom"
    assert (
        _said(
            "2020-06-15 13:25:20.1: I tensorflow/core/common_runtime/gpu/gpu_device.cc:1351] Created TensorFlow "
            "device (/job:localhost/replica:0/task:0/device:GPU:0 with 10000 MB memory)\n"
        )
        != "oom"
    )


def test_ipythons_time_report_ends_a_cell_and_neoxs_overflow_monitor_gives_up() -> None:
    """IPython's `%%time` report after a fit is the cell's end (only
    with no failure before it), and GPT-NeoX giving up on repeated fp16 overflows is divergence."""
    fit = "".join(f"epoch {i}  | loss: 0.4{i} |  0:00:0{i}s\n" for i in range(5))
    timed = "CPU times: user 3min 22s, sys: 344 ms, total: 3min 23s\nWall time: 55.2 s\n"
    assert _said(fit + timed) == "completed"
    assert _said(fit + "CPU times: user 1.2 s, sys: 0 ns, total: 1.2 s\nWall time: 1min 4s\n") == "completed"
    assert _said(fit + "RuntimeError: CUDA error: device-side assert triggered\n" + timed) != "completed"
    assert _said(fit + "Wall time per step: 55.2 s\n") != "completed"
    neox = (
        '  File "~/gpt-neox/megatron/utils.py", line 353, in check\n    raise Exception(\n'
        "Exception: Skipped 50 iterations in a row due to Overflow - Exiting training.\n"
    )
    assert _said(neox) == "diverged"
    assert _said(fit + "Skipped 2 iterations due to data loading\n") != "diverged"


def test_ray_tunes_closing_run_time_ends_a_sweep_only_when_no_trial_failed() -> None:
    """Written from Ray Tune's source: `Total run time: ... (... seconds for the tuning loop).` is logged
    as the tuning loop returns, after "Trials did not complete" when trials failed and it does not raise."""
    table = "| train_fn_16400_00004 | TERMINATED | 10.0.0.2:21449 |  8 |  0.00265 |\n"
    end = "2022-04-30 16:56:45,749\tINFO tune.py:702 -- Total run time: 60.09 seconds (59.96 seconds for the tuning loop).\n"
    assert _said(table + end) == "completed"
    failed = "2022-04-30 16:56:45,700\tERROR tune.py:941 -- Trials did not complete: [train_fn_16400_00004]\n"
    assert _said(table + failed + end) != "completed"
    assert _said(table + "Total run time so far: 60.09 seconds\n") != "completed"


def test_a_closing_summary_with_a_nan_loss_fairseqs_zero_oom_counter_and_flowers_end() -> None:
    """Each in its general form with its near miss: a closing summary
    that reports a NaN loss on its own line is divergence, whichever key comes first; fairseq's `oom=0.000`
    progress stat is a counter at zero; Flower's server logs `FL finished in <seconds>` after its last round."""
    steps = "".join(f"{{'loss': nan, 'learning_rate': 4.{i}e-05, 'epoch': 0.{i}}}\n" for i in range(3))
    nan_out = "TrainOutput(global_step=1276, training_loss=nan, metrics={'train_runtime': 340.44, 'epoch': 1.0})\n"
    assert _said(nan_out) == "diverged"
    assert _said(steps.replace("nan", "0.61") + nan_out.replace("=nan", "=0.61")) == "completed"
    assert (
        _said("{'train_runtime': 340.44, 'train_samples_per_second': 3.748, 'train_loss': nan, 'epoch': 1.0}\n")
        == "diverged"
    )
    bar = (
        " epoch 031:  53%|▌| 28980/55116 [2:01:41<1:45:30,  4.13it/s, loss=3.662, nll_loss=1.945, ppl=3.85, "
        "wps=13520, ups=4, wpb=3406.657, bsz=107.062, lr=2.43802e-05, gnorm=3.772, clip=0.000, oom={}, "
        "loss_scale=2.000, wall=441405]\n"
    )
    assert _said(bar.format("0.000") * 3) == "progressing"
    assert _said(bar.format("0") * 3) == "progressing"
    assert (
        _said(
            bar.format("0.000") * 3 + "| WARNING: ran out of memory with exception: CUDA out of memory. "
            "Tried to allocate 1.10 GiB\n"
        )
        == "oom"
    )
    flower = (
        "INFO flower 2022-01-06 09:21:15,045 | server.py:148 | fit progress: (4, 2.3478, {'accuracy': 0.14}, 307.96)\n"
    )
    assert _said(flower) == "progressing"
    assert (
        _said(
            flower + "INFO flower 2022-01-06 09:21:15,045 | server.py:172 | FL finished in 307.96627069999977\n"
            "INFO flower 2022-01-06 09:21:15,045 | app.py:119 | app_fit: losses_distributed []\n"
        )
        == "completed"
    )
    assert _said(flower + "INFO :      [SUMMARY]\nINFO :      Run finished 3 round(s) in 12.34s\n") == "completed"
    assert _said(flower + "INFO flower | FL finished: client 3 disconnected\n") != "completed"


def test_lightnings_callbacks_raising_on_a_metric_never_logged_are_a_config_error() -> None:
    """Written from Lightning's source: EarlyStopping (strict, the default) raises
    when its monitored metric is never logged, ModelCheckpoint once validation ran; non-strict, or before
    validation, each only warns and the run goes on to its end."""
    bar = "Epoch 0: 100%|██████████| 260/260 [01:26<00:00,  3.00it/s, v_num=2, train_loss=0.412]\n"
    raised = (
        '  File "lightning/pytorch/callbacks/early_stopping.py", line 153, in _validate_condition_metric\n'
        "    raise RuntimeError(error_msg)\nRuntimeError: Early stopping conditioned on metric `val_loss` which is "
        "not available. Pass in or modify your `EarlyStopping` callback to use any of the following: `train_loss`\n"
    )
    assert classify(bar + raised).state == "data_error"
    assert (
        _said(
            "lightning_fabric.utilities.exceptions.MisconfigurationException: `ModelCheckpoint(monitor="
            "'val_total_loss')` could not find the monitored key in the returned metrics: ['train_loss', "
            "'epoch', 'step']. HINT: Did you call `log('val_total_loss', value)` in the `LightningModule`?\n"
        )
        == "data_error"
    )
    warned = (
        "lightning/pytorch/callbacks/model_checkpoint.py:384: `ModelCheckpoint(monitor='val_loss')` could not "
        "find the monitored key in the returned metrics: ['train_loss', 'epoch', 'step']. HINT: Did you call "
        "`log('val_loss', value)` in the `LightningModule`?\n"
    )
    assert _said(bar + warned + bar) == "progressing"
    assert _said(bar + warned + "`Trainer.fit` stopped: `max_epochs=2` reached.\n") == "completed"
    keras = (
        "WARNING:tensorflow:Early stopping conditioned on metric `val_loss` which is not available. Available "
        "metrics are: loss,accuracy\n"
    )
    assert (
        _said(
            "Epoch 3/10\n100/100 [==============================] - 2s 20ms/step - loss: 0.41 - accuracy: 0.88\n"
            + keras
        )
        != "data_error"
    )


def test_a_watchdogs_abort_reason_lightnings_empty_fit_hydras_overrides_and_an_api_connection_error() -> None:
    """A communicator the NCCL watchdog aborted, Lightning's fit with no training batches, Hydra's refused
    overrides and an API client's connection error, each with its near miss beside it."""
    frames = (
        '  File "torch/distributed/distributed_c10d.py", line 1700, in all_reduce\n'
        "    work = default_pg.allreduce([tensor], opts)\n"
    )
    aborted = "RuntimeError: NCCL communicator was aborted on rank 0.  Original reason for failure was: "
    # the watchdog aborted the communicator for a timeout (even cut mid-word, as posted): a stall
    assert _said(frames + aborted + "[Rank 0] Watchdog caug") == "stalled"
    assert (
        _said(
            frames + aborted + "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
            "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800461 milliseconds before timing out.\n"
        )
        == "stalled"
    )
    # ... for an NCCL error, a device fault
    assert _said(frames + aborted + "NCCL error: unhandled cuda error, NCCL version 2.18.1\n") == "cuda_fault"
    # Lightning's fit with an empty train dataloader; its normal end stays a completion
    empty = (
        "lightning/pytorch/utilities/data.py:106: Total length of `DataLoader` across ranks is zero. Please make "
        "sure this was your intention.\n"
    )
    assert classify(empty + "`Trainer.fit` stopped: No training batches.\n").state == "data_error"
    assert (
        _said(
            empty + "Epoch 9: 100%|██████████| 26/26 [00:04<00:00, 6.1it/s, loss=0.31]\n"
            "`Trainer.fit` stopped: `max_epochs=10` reached.\n"
        )
        == "completed"
    )
    # Hydra refusing an override, OmegaConf a key its schema lacks or a value never set
    hydra_tail = "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
    assert (
        classify(
            "Could not override 'actor_rollout_ref.rollout.n'.\nTo append to your config use "
            "+actor_rollout_ref.rollout.n=16\nKey 'n' is not in struct\n    full_key: actor_rollout_ref.rollout.n\n"
            "    object_type=dict" + hydra_tail
        ).state
        == "data_error"
    )
    assert (
        classify(
            "omegaconf.errors.MissingMandatoryValue: Missing mandatory value: data_dir\n"
            "    full_key: data_dir\n    object_type=dict" + hydra_tail
        ).state
        == "data_error"
    )
    assert (
        _said(
            "[2024-05-01 10:00:00,000][__main__][INFO] - Could not override the default seed; using 42\n"
            "step 10 | loss 2.31 | lr 3e-4\n"
        )
        == "progressing"
    )
    # openai-python's APIConnectionError as a rollout client logs it; Ray's worker-exit detail is not one
    assert (
        _said(
            "Generating rollouts (train):  75%|███████▌  | 96/128 [01:31<00:12,  2.63it/s]2025-12-02 03:58:17 - "
            "verifiers.envs.Env - ERROR - Error getting model response: Connection error.\nExiting...\n"
        )
        == "io_error"
    )
    assert (
        _said(
            "(raylet) Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
            "connection error code 2. End of file. There are some potential root causes.\n"
        )
        != "io_error"
    )


def test_detrs_training_time_past_a_day_and_litgpts_closing_training_time() -> None:
    """Written from the sources: DETR's main() (and DeiT, MAE, DINO, ... built on it) prints
    `Training time {timedelta}` after its loop, with days once a run passes 24 hours; litgpt prints
    `Training time: {s:.2f}s` as train() returns. Per-epoch times and a failure before either are not an end."""
    epochs = (
        "Epoch: [299]  [1250/1251]  eta: 0:00:00  lr: 0.000001  loss: 2.8312 (2.9012)  time: 0.3121\n"
        "* Acc@1 81.812 Acc@5 95.600 loss 0.802\nMax accuracy: 81.83%\n"
    )
    assert _said(epochs + "Training time 1 day, 8:12:40\n") == "completed"
    assert _said(epochs + "Training time 2 days, 0:00:01\n") == "completed"
    assert _said(epochs + "Training time per epoch 0:06:31\n") == "progressing"
    lit = "Epoch 3 | iter 600 step 150 | loss train: 1.210, val: n/a | iter time: 120.50 ms (step)\n"
    assert _said(lit + "Training time: 345.12s\nMemory used: 10.21 GB\n") == "completed"
    assert _said(lit + "Training time: 345.12s per epoch, 2h left\n" + lit) == "progressing"
    assert (
        _said(lit + "RuntimeError: CUDA error: an illegal memory access was encountered\nTraining time: 345.12s\n")
        == "cuda_fault"
    )


def test_torchtunes_final_epoch_save_and_speechbrains_test_stage_end_a_run() -> None:
    """Written from the sources: torchtune's checkpointers log "Saving final epoch checkpoint." only for
    the last epoch (earlier ones save "recipe state"); SpeechBrain's recipes log the test stage's stats
    ("Epoch loaded: N - test ...") from evaluate(), after fit() returned."""
    bar = "1|1625|Loss: 1.5839784145355225: 100%|██████████| 1625/1625 [22:01<00:00,  1.23it/s]\n"
    log = "INFO:torchtune.utils._logging:"
    assert (
        _said(
            f"{log}Saving final epoch checkpoint.\n{log}The full model checkpoint, including all weights and "
            f"configurations, has been saved successfully.You can now use this checkpoint for further training "
            f"or inference.\n{log}Saving checkpoint took 6.64 secs\n" + bar
        )
        == "completed"
    )
    assert (
        _said(f"{log}Saving current epoch's recipe state...\n{log}Saving checkpoint took 6.64 secs\n" + bar)
        != "completed"
    )
    sb = "speechbrain.utils.train_logger - "
    epoch = sb + "epoch: 20, lr: 1.00e-04 - train loss: 0.21 - valid loss: 0.33, valid CER: 4.1, valid WER: 11.2\n"
    assert _said(epoch + sb + "Epoch loaded: 20 - test loss: 0.35, test CER: 4.3, test WER: 11.9\n") == "completed"
    assert _said(epoch) == "progressing"


def test_opennmts_step_report_is_progress_and_its_last_step_ends_the_run() -> None:
    """Written from OpenNMT-py's Statistics.output: "Step N/M; acc: ...; ppl: ...; xent: ...; lr: ..."
    (no "loss" in it) is progress; its trainer stops at train_steps, so the report at M/M is the end."""

    def report(step: int, total: int) -> str:
        return (
            f"[2023-01-01 10:00:00,000 INFO] Step {step:2d}/{total:5d}; acc:  41.23; ppl: 22.10; xent: 3.10; "
            f"lr: 0.00100; 3000/2900 tok/s;   1200 sec\n"
        )

    assert classify(report(50, 100000) + report(100, 100000)).state == "progressing"
    assert (
        _said(
            report(99950, 100000)
            + report(100000, 100000)
            + "[2023-01-01 10:00:01,000 INFO] Saving checkpoint models/model_step_100000.pt\n"
        )
        == "completed"
    )
    assert _said(report(100, 100000), idle=7200) == "stalled"
    assert _said(report(100, 100000) + "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n") == "oom"
    # another tool's "Step N; acc" without OpenNMT's layout is not read as its report
    assert classify("Step 5 acc 0.5 done\n").state != "completed"


def test_openmmlabs_iteration_report_at_max_iters_ends_the_run() -> None:
    """Written from mmengine's LogProcessor ("Iter(train) [  50/80000]  base_lr: ...", the count
    right-justified) and mmcv 1.x's TextLoggerHook ("Iter [N/M]\tlr: ..."): the runner stops at
    max_iters, so that iteration's report is the last, whatever validation and saving follow it."""

    def mmengine(mode: str, it: int, total: int) -> str:
        return (
            f"12/04 15:00:20 - mmengine - INFO - Iter({mode}) [{it:>{len(str(total))}}/{total}]  base_lr: 1.0000e-04 "
            f"lr: 1.0000e-06  eta: 0:00:00  time: 0.4100  data_time: 0.0100  memory: 9876  loss: 0.1200\n"
        )

    val = "12/04 15:01:03 - mmengine - INFO - Iter(val) [500/500]    eta: 0:00:00  time: 0.0600  memory: 1234\n"
    save = "12/04 15:00:20 - mmengine - INFO - Saving checkpoint at 80000 iterations\n"
    assert _said(mmengine("train", 79950, 80000) + mmengine("train", 80000, 80000) + save + val) == "completed"
    assert _said(mmengine("train", 50, 80000) + save + val) == "progressing"
    assert (
        _said(mmengine("train", 80000, 80000) + "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        == "oom"
    )
    mmcv = "2021-03-01 10:00:00,000 - mmseg - INFO - Iter [{}/160000]\tlr: 1.000e-04, eta: 0:00:00, time: 0.300, loss: 0.1000\n"
    assert _said(mmcv.format(160000)) == "completed"
    assert _said(mmcv.format(16000)) == "progressing"
    assert _said(mmcv.format(16000), idle=7200) == "stalled"


def test_keras_3s_last_epoch_ends_the_run_by_its_count_not_its_bar() -> None:
    """Keras 3's progress line draws the same glyph done or not (only its colour differs, and posted logs
    often keep the colour codes without their ESC), so the last epoch is done when its count is k/k."""
    full = "1875/1875 ━━━━━━━━━━━━━━━━━━━━ 5s 3ms/step - accuracy: 0.9901 - loss: 0.0312\n"
    assert classify("Epoch 10/10\n" + full).state == "completed"
    assert (
        _said("Epoch 10/10\n[1m1875/1875[0m [32m━━━━━━━━━━━━━━━━━━━━[0m[37m[0m [1m5s[0m 3ms/step - loss: 0.03\n")
        == "completed"
    )
    assert (
        _said(
            "Epoch 10/10\n\x1b[1m1875/1875\x1b[0m \x1b[32m━━━━━━━━━━━━━━━━━━━━\x1b[0m\x1b[37m\x1b[0m 3ms/step - loss: 0.03\n"
        )
        == "completed"
    )
    assert _said("Epoch 9/10\n" + full) == "progressing"
    assert _said("Epoch 10/10\n 231/1875 ━━━━━━━━━━━━━━━━━━━━ 1s 3ms/step - loss: 0.0312\n") == "progressing"
    assert (
        _said("Epoch 10/10\n[1m1200/1875[0m [32m━━━━━━━━━━━━[0m[37m━━━━━━━━[0m [1m5s[0m 3ms/step - loss: 0.03\n")
        == "progressing"
    )


def test_access_violations_empty_epochs_untrained_tokens_existing_checkpoint_dirs_and_closing_summaries() -> None:
    """Windows' access-violation exit, epochs that ran no batch, unsloth's untrained tokens, a checkpoint
    directory that already exists, HiFi-GAN's step line and two closing summaries, each in its general
    form, with the near miss beside it that must not change."""
    # Windows' segfault (STATUS_ACCESS_VIOLATION) as an IDE or a shell reports the exit code
    assert (
        _said(
            "Epoch 51/100:   0%|          | 0/18 [00:00<?, ?it/s]Start Train\n\n"
            "Process finished with exit code -1073741819 (0xC0000005)\n"
        )
        == "cuda_fault"
    )
    assert _said("worker exited with code 3221225477\n") == "cuda_fault"
    assert (
        _said(
            "Epoch 3/100: 100%|##########| 18/18 [00:09<00:00, 1.9it/s, loss=0.7]\nProcess finished with exit code 0\n"
        )
        != "cuda_fault"
    )
    # epochs whose bars end at zero, one after another: an empty dataset
    epoch = "INFO:OUTPUT_MODEL:====> Epoch: {}\n0it [00:00, ?it/s]\n"
    assert _said(epoch.format(1) + epoch.format(2) + "INFO:OUTPUT_MODEL:====> Epoch: 3\n") == "data_error"
    assert classify(epoch.format(1)).rule != "empty-epochs"  # one bar at zero may be a first draw
    redrawn = "0it [00:00, ?it/s]\n5it [00:01, 4.5it/s]\nepoch 2\n0it [00:00, ?it/s]\n7it [00:01, 4.5it/s]\n"
    assert classify(redrawn).rule != "empty-epochs"
    empty_val = (
        "Epoch {0}: 100%|#####| 50/50 [00:10<00:00, 5it/s, loss=0.3]\nValidation: 0%|          | 0/0 [00:00<?, ?it/s]\n"
    )
    assert _said(empty_val.format(1) + empty_val.format(2)) == "progressing"  # training itself advances
    # unsloth refusing untrained (reserved) tokens in the data: not a divergence, though it names NaNs
    untrained = (
        "Unsloth: Untrained tokens of [[128042, 128036]] found, but embed_tokens & lm_head not trainable, "
        "causing NaNs. Restart then add embed_tokens & lm_head to FastLanguageModel.get_peft_model(...)\n"
    )
    assert _said(untrained) == "data_error"
    assert classify("Unsloth: Untrained tokens found, setting them to the mean.\n").rule != "untrained-tokens"
    # a checkpoint's directory already there as the save creates it: a failed checkpoint write
    exists = "FileExistsError: [Errno 17] File exists: '/ckpt/run/30000.orbax-checkpoint-tmp-0'\n"
    assert _said("Traceback (most recent call last):\n" + exists) == "io_error"
    assert (
        _said("Traceback (most recent call last):\nFileExistsError: [Errno 17] File exists: 'runs/exp1'\n")
        != "io_error"
    )
    # HiFi-GAN's step line is progress, and its "Mel-Spec. Error : 0.407" metric is no error
    hifigan = "Steps : {}, Gen Loss Total : 25.663, Mel-Spec. Error : 0.407, s/b : 1.131\n"
    assert _said(hifigan.format(210005) + hifigan.format(210010)) == "progressing"
    assert _said(hifigan.format(210005), idle=7200) == "stalled"
    assert classify("Steps : 5, Mel-Spec. Error : 0.407\n").rule != "error-words"
    assert classify("training crashed: error in worker 3\n").rule == "error-words"
    # unsloth's per-step dict carries train_runtime beside its 'loss': progress, not the closing summary
    step = (
        "{'loss': '0.4247', 'grad_norm': '0.2317', 'learning_rate': '0.0001983', 'epoch': '0.009266', "
        "'train_runtime': '422.6', 'train_tokens_per_second': '505'}\n"
    )
    assert _said(step + step) == "progressing"
    assert (
        _said(step + "{'train_runtime': 4321.5, 'train_samples_per_second': 3.1, 'train_loss': 0.51, 'epoch': 3.0}\n")
        == "completed"
    )
    # modelscope KAN-TTS's closing "<MODEL> training spent: N hours": a run summary
    spent = "2023-09-25 09:26:04,203 - modelscope - INFO - SAMBERT training spent: 0.19 hours\n"
    assert _said("INFO:root:Epoch 999 finished\n" + spent) == "completed"
    assert (
        _said(
            "Traceback (most recent call last):\nRuntimeError: CUDA error: an illegal memory access was "
            "encountered\n" + spent
        )
        == "cuda_fault"
    )


def test_chainerrls_finish_save_a_lost_transport_endpoint_and_vits_refusing_the_cpu() -> None:
    """ChainerRL's closing save ends a run, a lost transport endpoint is a network failure, and VITS'
    refusal to train on a CPU is no device; each with its near misses."""
    saved = "INFO:chainerrl.experiments.train_agent_batch:Saved the agent to results/20190820T214258.089467/{}\n"
    assert (
        _said(saved.format("80_checkpoint") + saved.format("100_checkpoint") + saved.format("104_finish"))
        == "completed"
    )
    assert _said(saved.format("80_checkpoint") + saved.format("100_checkpoint")) != "completed"
    assert _said(saved.format("57_except") + "Traceback (most recent call last):\nKeyboardInterrupt\n") != "completed"
    drive = (
        'Traceback (most recent call last):\n  File "cloud_io.py", line 68, in atomic_save\n'
        "OSError: [Errno 107] Transport endpoint is not connected\n"
    )
    v = classify(drive)
    assert v.state == "io_error" and v.action == "retry on the same host (network)"
    assert classify("DEBUG:fsspec.local:open file: /content/drive/transport endpoint/last.ckpt\n").state != "io_error"
    # VITS' assert that CUDA is available, in the forks that keep its words: no device, not a Python bug
    vits = (
        'Traceback (most recent call last):\n  File "train.py", line 40, in main\n'
        '    assert torch.cuda.is_available(), "CPU training is not allowed."\n'
        "AssertionError: CPU training is not allowed.\n"
    )
    assert _said(vits) == "cuda_fault"
    assert _said("Warning: CPU training is slow; use a GPU\n") != "cuda_fault"


def test_atens_index_assertion_nan_loss_totals_and_tpu_runtime_failures() -> None:
    """ATen's index assertion is a data error, loss terms with a NaN total diverge, and a TPU runtime
    that fails to come up is a device fault; each with its near misses."""
    # ATen's IndexKernel assertion: an index (a class id, a label) past the tensor's size
    kernel = (
        "../aten/src/ATen/native/cuda/IndexKernel.cu:93: operator(): block: [91,0,0], thread: [80,0,0] "
        'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.\n'
    )
    assert (
        classify(kernel + 'Traceback (most recent call last):\n  File "train.py", line 97, in <module>\n').state
        == "data_error"
    )
    assert (
        classify("Assertion `-sizes[i] <= index && index < sizes[i]` holds in every test we ran\n").state
        != "data_error"
    )
    # loss terms by name and value, their total NaN
    losses = (
        "[Epoch 0/30, Batch {}/1313] [Losses: x {x}, y 0.0251, w nan, h 0.0118, conf 0.757809, cls 0.0003, total {t}]\n"
    )
    assert classify(losses.format(326, x="nan", t="nan")).state == "diverged"
    healthy = losses.format(325, x="0.0211", t="1.2034").replace("w nan", "w 0.0104")
    assert classify(healthy, idle_seconds=5).state == "progressing"
    assert classify("[Losses: total 1.25, nan_steps 0]\n").state != "diverged"
    # the TPU's runtime failing to come up
    xrt = (
        "2020-03-06 21:12:24.724923: E    2858 tensorflow/compiler/xla/xla_client/tf_logging.cc:11] Check failed: "
        "session.Run({tensorflow::Output(result, 0)}, &outputs) == ::tensorflow::Status::OK() (Internal: From "
        "/job:tpu_worker/replica:0/task:0:\nGlobal core array does not contain host cores [0x0x0_TC0,0x0x0_TC1]\n"
        "\t [[{{node configure_distributed_tpu/_0}}]] vs. OK)\n*** Begin stack trace ***\n"
    )
    assert classify(xrt).state == "cuda_fault"
    assert (
        classify("ValueError: TPUs not found in the cluster. Failed in initialization of TPU system.\n").state
        == "cuda_fault"
    )
    assert (
        classify(
            "RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process "
            "with pid 4242.\n"
        ).state
        == "cuda_fault"
    )
    for healthy_line in (
        "INFO:jax._src.xla_bridge:Unable to initialize backend 'tpu_driver': NOT_FOUND: Unable to find "
        "driver in registry given worker:\n",
        "WARNING:jax._src.xla_bridge:No GPU/TPU found, falling back to CPU.\n",
    ):
        assert (
            classify(healthy_line + "{'loss': 0.52, 'learning_rate': 1e-05, 'epoch': 0.5}\n", idle_seconds=5).state
            == "progressing"
        )


def test_an_os_error_raised_under_a_checkpoint_save_is_a_failed_checkpoint_write() -> None:
    """The exception's own line may name no checkpoint (or be cut off); the traceback's frames do."""
    frames = (
        "[rank8]: Traceback (most recent call last):\n"
        '[rank8]:   File "recipes/llm/train_ft.py", line 981, in run_train_validation_loop\n'
        "[rank8]:     self.save_checkpoint(\n"
        '[rank8]:   File "components/checkpoint/checkpointing.py", line 2011, in _create_dirs\n'
        "[rank8]:     os.makedirs(directory, exist_ok=True)\n"
        '[rank8]:   File "<frozen os>", line 225, in makedirs\n'
    )
    saving = frames.replace("in run_train_validation_loop", "in save_checkpoint")
    v = classify(saving + "[rank8]: FileExistsError: [Errno 17] File e\n")
    assert v.state == "io_error" and v.rule == "os-error-while-saving"
    # an excerpt that begins inside the traceback
    inside = saving.split("\n", 1)[1]
    assert classify(inside + "[rank8]: FileExistsError: [Errno 17] File e\n").rule == "os-error-while-saving"
    # no frame in a function that saves (a save only called in a source line, a dataset cache's
    # makedirs), or a save failing on no OS error: not this
    assert classify(frames + "[rank8]: FileExistsError: [Errno 17] File e\n").rule != "os-error-while-saving"
    cache = saving.replace("in save_checkpoint", "in prepare_dataset").replace("checkpoint", "cache")
    assert classify(cache + "[rank8]: FileExistsError: [Errno 17] File e\n").rule != "os-error-while-saving"
    assert classify(saving + "[rank8]: ValueError: bad state dict key\n").rule != "os-error-while-saving"
    # a checkpoint missing when the run resumes is no failed write
    loading = (
        'Traceback (most recent call last):\n  File "train.py", line 12, in load_checkpoint\n'
        "FileNotFoundError: [Errno 2] No such file or directory: 'ckpt/last.pt'\n"
    )
    assert classify(loading).rule != "os-error-while-saving"
