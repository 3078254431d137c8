"""Tables of bench/trainer_step.py: collected from the workers' JSON records, printed as they come and at the end."""

from __future__ import annotations

import importlib.metadata
import os

from bench._util import table

FAMILY_ORDER = ["GEMM fwd", "GEMM bwd", "GEMM fwd (recompute)", "attention fwd", "attention bwd",
                "attention fwd (recompute)", "norms", "RoPE", "SwiGLU", "log-softmax", "optimizer", "communication",
                "grad accumulation", "other", "unattributed", "GPU idle"]
IMPL_NAME = {"top": "TOP", "top_base": "TOP before", "top_flash_rc": "TOP flash recompute",
             "top_cublas_rc": "TOP cuBLAS recompute", "stock": "stock"}


def _f(x, fmt="{:.1f}"):
    return "-" if x is None or x != x else fmt.format(x)


def _spread(times):
    return f"{min(times):.1f}-{max(times):.1f}" if times else "-"


def _version(pkg):
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


class Report:
    def __init__(self, args):
        self.args = args
        self.records: list[dict] = []
        self.status: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------------------------------ collecting
    def add(self, kind: str, rec: dict) -> None:
        self.records.append({"kind": kind, **rec})

    def _of(self, kind, **match):
        return [r for r in self.records if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())]

    def results(self, **match):
        """The last RESULT per (model, impl, recompute): an OOM retry's row replaces the OOM row."""
        last = {}
        for r in self._of("RESULT", **match):
            last[(r["model"], r["impl"], r["recompute"])] = r
        return list(last.values())

    def skip(self, key, why):
        self.status[key] = why

    def finish(self, key, rc, timed_out, seconds, last_error=""):
        err = f"; last error: {last_error}" if last_error else ""
        if timed_out:
            self.status[key] = f"worker killed after {seconds:.0f} s (timeout); rows so far kept{err}"
        elif rc != 0:
            self.status[key] = f"worker exit code {rc} after {seconds:.0f} s{err}"
        else:
            self.status[key] = f"done in {seconds:.0f} s{err}"

    def chosen_attention(self, model):
        ok = [(r["ms"], r["impl"]) for r in self._of("ATTN", model=model) if r["status"] == "ok" and r["ms"] is not None]
        return min(ok)[1] if ok else None

    def all_ok(self) -> bool:
        rows = self.results()
        return bool(rows) and all(r["status"] == "ok" for r in rows) and not any(
            s.startswith(("worker", "skipped")) for s in self.status.values())

    # ------------------------------------------------------------------------------------ tables
    def header(self) -> str:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        vers = ", ".join(f"{p} {_version(p)}" for p in ("torch", "triton", "megatron-core", "sglang", "flashinfer-python"))
        from bench._trainer_common import sequence_lengths

        lens = sequence_lengths(self.args.tokens)
        return (f"# Trainer step: TOP vs stock Megatron-core\n\n{gpu}; {vers}\n"
                f"TOP attention backend: {os.environ.get('TOP_RL_ATTENTION_BACKEND', 'triton')}; models: "
                f"{self.args.models}; batch: {self.args.tokens} tokens in {len(lens)} sequences {lens} (first "
                f"quarter of each is prompt, not scored); warmup {self.args.warmup}, median of {self.args.iters} steps\n")

    def attention_table(self, rc, timed_out, last_error="") -> str:
        rows = [[r["model"], r["impl"], _f(r["ms"], "{:.2f}"), r["status"]] for r in self._of("ATTN")]
        tail = "" if rc == 0 else (f"\n(selection worker {'timed out' if timed_out else f'exit code {rc}'}"
                                   f"{': ' + last_error if last_error else ''}; the rows above stand)\n")
        chosen = {m: self.chosen_attention(m) for m in self.args.models.split(",")}
        return table("stock attention candidates: fwd+bwd ms on the batch, checked against fp32 math",
                     ["model", "kernel", "fwd+bwd ms", "status"], rows) + tail + f"chosen: {chosen}\n"

    def _result_rows(self, rows):
        out = []
        order = {"top": 0, "top_base": 1, "top_flash_rc": 2, "top_cublas_rc": 3, "stock": 4}
        for r in sorted(rows, key=lambda r: (r["model"], not r["recompute"], order[r["impl"]])):
            if r["status"] != "ok":
                out.append([r["model"], IMPL_NAME[r["impl"]], "on" if r["recompute"] else "off",
                            str(r.get("mbt", "-")), "-", "-", "-", "-", "-", "-", "-", "-", r["status"]])
                continue
            out.append([r["model"], IMPL_NAME[r["impl"]], "on" if r["recompute"] else "off",
                        f"{r['micro_batches']}x{r['mbt']}", _f(r["step_ms"]), _spread(r.get("step_ms_all")),
                        _f(r["tokens_per_s"] / 1e3, "{:.1f}k"), _f(r["tflops"], "{:.0f}"), _f(100 * r["mfu"], "{:.1f}%"),
                        _f(100 * r["hfu"], "{:.1f}%") if "hfu" in r else "-", _f(r["peak_gib"]),
                        _f(r.get("gate_ms")), "ok"])
        return out

    RESULT_HEADER = ["model", "trainer", "recompute", "micro-batches x tokens", "step ms (median)", "min-max ms",
                     "tokens/s", "model TFLOP/s", "MFU (989.4)", "HFU (989.4)", "peak GiB", "gate fwd ms", "status"]

    def progress(self, model, impl, rc) -> str:
        recompute = rc == "on"
        rows = self._result_rows(self.results(model=model, impl=impl, recompute=recompute))
        notes = [r["text"] for r in self._of("NOTE", model=model, impl=impl, recompute=recompute)]
        title = f"{model} {IMPL_NAME[impl]} recompute {rc}"
        text = table(title, self.RESULT_HEADER, rows) if rows else f"{title}: no rows\n"
        return text + "".join(f"note: {n}\n" for n in notes) + f"status: {self.status.get((model, impl, rc), '?')}\n"

    def ratio_table(self) -> str:
        rows = []
        for model in self.args.models.split(","):
            for rc in (True, False):
                top = [r for r in self.results(model=model, impl="top", recompute=rc) if r["status"] == "ok"]
                stock = [r for r in self.results(model=model, impl="stock", recompute=rc) if r["status"] == "ok"]
                base = [r for r in self.results(model=model, impl="top_base", recompute=rc) if r["status"] == "ok"]
                flash = [r for r in self.results(model=model, impl="top_flash_rc", recompute=rc) if r["status"] == "ok"]
                cublas = [r for r in self.results(model=model, impl="top_cublas_rc", recompute=rc) if r["status"] == "ok"]
                if top and stock:
                    t, s = top[0], stock[0]
                    profs = {r["impl"]: r for r in self._of("PROFILE", model=model, recompute=rc)}
                    busy = (_f(profs["top"]["busy_ms"] / profs["stock"]["busy_ms"], "{:.2f}")
                            if {"top", "stock"} <= set(profs) else "-")
                    rows.append([model, "on" if rc else "off", _f(base[0]["step_ms"]) if base else "-",
                                 _f(t["step_ms"]), _f(s["step_ms"]), _f(t["step_ms"] / s["step_ms"], "{:.2f}"), busy,
                                 _f(flash[0]["step_ms"] / s["step_ms"], "{:.2f}") if flash else "-",
                                 _f(cublas[0]["step_ms"] / s["step_ms"], "{:.2f}") if cublas else "-",
                                 _f(100 * t["mfu"], "{:.1f}%"), _f(100 * s["mfu"], "{:.1f}%"),
                                 "" if t["mbt"] == s["mbt"] else f"mbt TOP {t['mbt']} / stock {s['mbt']}"])
        return table("TOP / stock step time (acceptance: <= 1.15; TOP before = fused forwards/backwards off, "
                     "memory-efficient attention backward; flash recompute: top.fast_paths.recompute_attention; "
                     "cuBLAS recompute: top.fast_paths.recompute_gemm; "
                     "GPU busy: of the profiled steps, steadier than wall-clock, "
                     "whose GPU idle time moves by tens of ms between runs)",
                     ["model", "recompute", "TOP before ms", "TOP ms", "stock ms", "TOP/stock", "GPU busy TOP/stock",
                      "TOP flash recompute/stock", "TOP cuBLAS recompute/stock", "TOP MFU", "stock MFU", "note"],
                     rows)

    def profile_tables(self, top_n: int) -> str:
        text = ""
        keys = sorted({(r["model"], r["recompute"]) for r in self._of("PROFILE")})
        for model, rc in keys:
            profs = {r["impl"]: r for r in self._of("PROFILE", model=model, recompute=rc)}
            impls = [i for i in ("top", "stock") if i in profs]
            header = ["family"] + [f"{IMPL_NAME[i]} {c}" for i in impls for c in ("ms", "%")]
            rows = []
            for fam in FAMILY_ORDER:
                vals = [profs[i]["families"].get(fam, 0.0) for i in impls]
                if not any(v > 0.05 for v in vals):
                    continue
                row = [fam]
                for i, v in zip(impls, vals):
                    row += [_f(v), _f(100 * v / profs[i]["wall_ms"], "{:.1f}")]
                rows.append(row)
            rows.append(["step (wall, unprofiled)"] + [c for i in impls for c in (_f(profs[i]["wall_ms"]), "100")])
            busy = [(_f(profs[i]["busy_ms"]), _f(100 * profs[i]["busy_ms"] / profs[i]["wall_ms"], "{:.1f}")) for i in impls]
            rows.append(["GPU busy (profiled step)"] + [c for pair in busy for c in pair])
            text += table(f"profile {model}, recompute {'on' if rc else 'off'}: GPU time per op family "
                          f"(% of the unprofiled step)", header, rows)
            for i in impls:
                kr = [[k[0], k[1], _f(k[2]), str(k[3])] for k in profs[i]["top_kernels"][:top_n]]
                text += table(f"top kernels, {model} {IMPL_NAME[i]}, recompute {'on' if rc else 'off'}",
                              ["kernel", "family", "ms", "calls"], kr)
        return text

    def final(self, elapsed_s: float, log_path, full: bool = False) -> str:
        parts = ["\n# Final\n", table("trainer step, all runs", self.RESULT_HEADER, self._result_rows(self.results())),
                 self.ratio_table(), self.profile_tables(12 if full else 5)]
        if full:
            parts = [self.header()] + parts + [self.attention_table(0, False)]  # rows only; status printed live
        notes = sorted({f"{r['model']} {IMPL_NAME[r['impl']]}: {r['text']}" for r in self._of("NOTE")})  # same per rc
        parts.append("".join(f"note: {n}\n" for n in notes))
        parts.append("".join(f"worker {m} {IMPL_NAME[i]} recompute {rc}: {s}\n"
                             for (m, i, rc), s in sorted(self.status.items())))
        parts.append(f"total {elapsed_s:.0f} s; worker logs: {log_path}\n")
        return "\n".join(parts)
