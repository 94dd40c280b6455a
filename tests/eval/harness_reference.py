#!/usr/bin/python3
"""Independent float64 computation of lm-evaluation-harness's (v0.4.9) task
definitions, used by eval_tasks_cli_test.cc to check `nekton eval tasks`.

Written from the harness's documented behaviour, not from Nekton's code: the
task YAML is read with PyYAML and its templates rendered by Python Jinja2
(StrictUndefined, as the harness renders them); few-shot examples drawn with
random.Random(1234).sample in document order; the model is
tests/model/torch_reference.py's forward in float64 over the byte tokenizer
(ids 0..255, end of text 256 as the prefix token); requests, metrics, filters
and standard errors as the harness defines them.

usage: harness_reference.py PLAN.json   (exits non-zero on any mismatch)
PLAN: {"data": DIR, "results": FILE, "samples": FILE, "ll_tol": x, "bootstrap_iters": n,
       "system_instruction": s, "chat_template": JINJA, "multiturn": bool (optional),
       "tasks": [{"yaml": FILE, "model": DIR}],
       "task_dir": DIR, "groups": [NAME, ...] (optional: group scores to check),
       "expand": [NAME, ...], "expand_model": DIR (optional: the tasks those
       groups stand for, inline definitions merged, checked too)}
"""
import ast
import json
import math
import os
import random
import re
import string
import sys

import jinja2
import jinja2.sandbox
import torch
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
import torch_reference  # noqa: E402

EOT = 256
env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("MISMATCH", what)


def render(t, doc):
    return env.from_string(t).render(**doc)


class Task:
    def __init__(self, path, data, config=None, data_name=None):
        """A task YAML, or (config) its keys already merged; its documents
        under data/DATA_NAME (the task's name unless given)."""
        self.cfg = config if config is not None else yaml.safe_load(open(path))
        c = self.cfg
        self.name = c["task"]
        folder = data_name or self.name
        self.out = c.get("output_type", "generate_until")
        self.td = c.get("target_delimiter", " ")
        self.fd = c.get("fewshot_delimiter", "\n\n")
        self.shots = c.get("num_fewshot", 0) or 0

        def load(split):
            f = os.path.join(data, folder, split + ".jsonl")
            return [json.loads(l) for l in open(f) if l.strip()]

        self.eval_split = c.get("test_split") or c.get("validation_split")
        self.docs = load(self.eval_split)
        fs = c.get("fewshot_split") or c.get("training_split") or c.get("validation_split") or c.get("test_split")
        self.pool = load(fs) if self.shots else []
        self.exclude = c.get("fewshot_split") == c.get("test_split")
        self.rnd = random.Random(1234)
        # The harness's Task: multiple-input (Winogrande) when the first
        # scored document's doc_to_text is an int and the task has choices.
        self.multiple_input = self.out == "multiple_choice" and isinstance(self.text(self.docs[0]), int)

    def field(self, key, doc):
        return doc[key] if key in doc else None

    def text(self, doc):
        t = self.cfg["doc_to_text"]
        if t in doc:
            return doc[t]
        s = render(t, doc)
        return ast.literal_eval(s) if s.isdigit() and "doc_to_choice" in self.cfg else s

    def target(self, doc):
        t = self.cfg["doc_to_target"]
        if isinstance(t, int):
            return t
        if t in doc:
            return doc[t]
        s = render(t, doc)
        if s.isdigit() and "doc_to_choice" in self.cfg:
            return ast.literal_eval(s)
        if len(s) >= 2 and s[0] == "[" and s[-1] == "]":
            return ast.literal_eval(s)
        return s

    def choices(self, doc):
        c = self.cfg["doc_to_choice"]
        if isinstance(c, list):
            return c
        if isinstance(c, dict):
            return list(c.values())
        return doc[c] if c in doc else ast.literal_eval(render(c, doc))

    def answer(self, doc, t):
        if isinstance(t, list):
            return str(t[0])
        if isinstance(t, str) or "doc_to_choice" not in self.cfg:
            return t
        return str(self.choices(doc)[t])

    def context(self, doc, style):
        """style: system_instruction, chat_template (Jinja source or None),
        multiturn, as lm_eval's --system_instruction, --apply_chat_template
        and --fewshot_as_multiturn."""
        desc = render(self.cfg["description"], doc) if self.cfg.get("description") else ""
        inst = style.get("system_instruction") or ""
        system = inst + self.fd + desc if inst and desc else inst or desc
        # gen_prefix (lm_eval 0.4.9): the scored document's, a field or a
        # template; after the question with target_delimiter, and with a
        # space before every shot's answer when not empty.
        gp = self.cfg.get("gen_prefix")
        if gp is not None:
            gp = doc[gp] if gp in doc else render(gp, doc)
        lead = gp + " " if gp else ""
        drawn, shots = [], ""
        if self.shots:
            n = self.shots + 1 if self.exclude else self.shots
            drawn = [x for x in self.rnd.sample(self.pool, n) if x != doc][: self.shots]
            for d in drawn:
                q = self.text(d)
                shots += self.choices(d)[q] if isinstance(q, int) else q
                t = self.target(d)
                if t != "":
                    shots += self.td + lead + self.answer(d, t) + self.fd
        if self.multiple_input:  # the labeled examples; each choice appended
            return system + shots
        q = self.text(doc)
        if not style.get("chat_template"):
            return system + shots + q + (self.td + gp if gp is not None else "")
        msgs = [{"role": "system", "content": system}] if system else []
        if drawn and style.get("multiturn"):
            for d in drawn:
                msgs.append({"role": "user", "content": self.text(d)})
                msgs.append({"role": "assistant", "content": lead + self.answer(d, self.target(d))})
        elif drawn:
            msgs.append({"role": "user", "content": shots})
        if style.get("multiturn") or not msgs or msgs[-1]["role"] == "system":
            msgs.append({"role": "user", "content": q})
        else:
            msgs[-1]["content"] += q
        # A gen_prefix opens the assistant's turn: add_generation_prompt off
        # and continue_final_message on (lm_eval's HFLM.apply_chat_template).
        if gp:
            msgs.append({"role": "assistant", "content": gp})
        # As transformers' apply_chat_template renders.
        chat_env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        text = chat_env.from_string(style["chat_template"]).render(
            messages=msgs, add_generation_prompt=not gp, bos_token="", eos_token="")
        if gp:  # continue_final_message: cut after the final message's content
            at = text.rindex(gp.strip())
            if text[at : at + len(gp.lstrip())] == gp:
                text = text[: at + len(gp.lstrip())]
            else:
                text = text[: at + len(gp.strip())]
        return text


class Model:
    def __init__(self, folder):
        self.cfg = json.load(open(os.path.join(folder, "config.json")))
        P = torch_reference.read_safetensors(os.path.join(folder, "model.safetensors"))
        self.P = {k: v.double() for k, v in P.items()}
        self.L = self.cfg["max_seq_len"]

    def logprobs(self, ids):  # [T, V] float64
        x = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            return torch.log_softmax(torch_reference.forward(self.cfg, self.P, x)[0].double(), -1)

    def score(self, inp, cont):
        lp = self.logprobs(inp)
        n, k = len(inp), len(cont)
        ll, greedy = 0.0, True
        for i in range(k):
            row = lp[n - k + i]
            ll += float(row[cont[i]])
            greedy = greedy and int(row.argmax()) == cont[i]
        return ll, greedy

    def loglikelihood(self, ctx, cont):
        enc = lambda s: list(s.encode("utf-8"))
        if ctx == "":
            c, w = [EOT], enc(cont)
        else:
            sp = len(ctx) - len(ctx.rstrip())
            if sp:
                cont, ctx = ctx[-sp:] + cont, ctx[:-sp]
            whole, c = enc(ctx + cont), enc(ctx)
            w = whole[len(c):]
        full = (c + w)[-(self.L + 1):]
        return self.score(full[:-1], w)

    def rolling(self, text):
        toks = list(text.encode("utf-8"))
        L, total, done = self.L, 0.0, 0
        first = min(L, len(toks))
        total += self.score([EOT] + toks[: first - 1], toks[:first])[0]
        done = first
        while done < len(toks):
            k = min(len(toks) - done, L)
            end = done + k
            total += self.score(toks[end - L - 1: end - 1], toks[end - k: end])[0]
            done = end
        return total

    def generate(self, ctx, until, max_gen):
        ids = list(ctx.encode("utf-8"))[-(self.L - max_gen):]
        out = []
        for _ in range(max_gen):
            t = int(self.logprobs(ids + out)[-1].argmax())
            if t == EOT:
                break
            out.append(t)
            s = bytes(out).decode("utf-8", errors="replace")
            if any(u and u in s for u in until):
                break
        s = bytes(out).decode("utf-8", errors="replace")
        for u in until:
            if u:
                s = s.split(u)[0]
        return s


def exact_match(p, r, m):
    for rx in m.get("regexes_to_ignore") or []:
        p, r = re.sub(rx, "", p), re.sub(rx, "", r)
    if m.get("ignore_case"):
        p, r = p.lower(), r.lower()
    if m.get("ignore_punctuation"):
        tb = str.maketrans("", "", string.punctuation)
        p, r = p.translate(tb), r.translate(tb)
    if m.get("ignore_numbers"):
        tb = str.maketrans("", "", string.digits)
        p, r = p.translate(tb), r.translate(tb)
    return 1.0 if p == r else 0.0


def regex_filter(resp, f):
    found = re.findall(f.get("regex_pattern", r"#### (\-?[0-9\.\,]+)"), resp)
    if not found:
        return f.get("fallback", "[invalid]")
    m = found[f.get("group_select", 0)]
    if isinstance(m, tuple):
        m = [x for x in m if x]
        m = m[0] if m else f.get("fallback", "[invalid]")
    return m.strip()


def bootstrap_stderr(f, xs, iters):
    """The harness's: chunks of min(1000, iters) resamples, chunk i drawn
    with random.Random(i).choices; the sample stddev of f over them all."""
    res, chunk = [], min(1000, iters)
    for i in range(iters // chunk):
        rnd = random.Random(i)
        for _ in range(chunk):
            res.append(f(rnd.choices(xs, k=len(xs))))
    mu = sum(res) / len(res)
    return math.sqrt(sum((x - mu) ** 2 for x in res) / (len(res) - 1))


def mean_stderr(xs):
    if len(xs) < 2:
        return "N/A"
    mu = sum(xs) / len(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) / math.sqrt(len(xs))


def group_files(task_dir):
    """name -> parsed YAML for groups and tasks; tag -> [task names]."""
    defined, tags = {}, {}
    for root, _, files in os.walk(task_dir):
        for f in files:
            if not f.endswith(".yaml"):
                continue
            y = yaml.safe_load(open(os.path.join(root, f)))
            if "group" in y and isinstance(y.get("task"), list):
                defined[y["group"]] = y
            else:
                defined[y["task"]] = y
                for t in ([y["tag"]] if isinstance(y.get("tag"), str) else y.get("tag") or []):
                    tags.setdefault(t, []).append(y["task"])
    return defined, tags


GROUP_ONLY = {"group", "group_alias", "task", "aggregate_metric_list", "metadata"}


def group_keys(y):
    """A group's task keys, which go over every task below it."""
    return {k: v for k, v in y.items() if k not in GROUP_ONLY}


def expand_group(y, defined, tags, update):
    mine = []  # the harness's task_group_map of this group
    return [t for e in y["task"] for t in expand(e, defined, tags, update, mine)]


def expand(entry, defined, tags, update=None, overridden=None):
    """The tasks an entry of eval.tasks or of a group's task list stands for,
    as (config, data folder), the way lm_eval 0.4.9's TaskManager loads them:
    a name is a tag's tasks, a group's entries (its own task keys under the
    enclosing ones) or a task; a name inside a group that puts keys over its
    tasks is loaded as an inline mapping of those keys; an inline mapping
    puts its keys (under the enclosing groups' own) over every task of the
    group or tag it names, or over the task it names (renamed NAME-k when its
    group already overrode k tasks named so), or defines a new task; a
    mapping with a task list is a group defined in place, its own task keys
    over its tasks (the enclosing ones dropped, as the harness does)."""
    update = update or {}
    if isinstance(entry, str) and update and overridden is not None and (
            entry in defined or entry in tags):
        entry = {"task": entry}
    if isinstance(entry, str):
        if entry in tags:
            return [t for n in tags[entry] for t in expand(n, defined, tags, update)]
        y = defined[entry]
        if "group" in y:
            return expand_group(y, defined, tags, {**group_keys(y), **update})
        return [({**y, **update}, entry)]
    if isinstance(entry.get("task"), list):
        return expand_group(entry, defined, tags, group_keys(entry))
    name = entry["task"]
    keys = {**{k: v for k, v in entry.items() if k != "task"}, **update}
    if name in tags or (name in defined and "group" in defined[name]):
        return expand(name, defined, tags, keys)
    if name not in defined:
        return [({**keys, "task": name}, name)]
    dups = len([n for n in overridden if n.startswith(name)]) if overridden is not None else 0
    renamed = f"{name}-{dups}" if dups else name
    if overridden is not None:
        overridden.append(renamed)
    return [({**defined[name], **keys, "task": renamed}, name)]


def inline_groups(defined):
    """name -> config of the groups defined in place inside group files."""
    out = {}

    def walk(y):
        for e in y["task"]:
            if isinstance(e, dict) and isinstance(e.get("task"), list):
                out[e["group"]] = e
                walk(e)
    for y in list(defined.values()):
        if "group" in y and isinstance(y.get("task"), list):
            walk(y)
    return out


def leaf_tasks(name, defined, tags):
    out = []
    inline = inline_groups(defined)
    for cfg, _ in expand(inline.get(name, name), defined, tags):
        if cfg["task"] not in out:
            out.append(cfg["task"])
    return out


def check_groups(plan, results, mine):
    """lm-evaluation-harness's group scores by hand: over every task below
    the group (subgroups flattened), the mean weighted by documents (or not),
    and the pooled standard error sqrt(sum((n-1) se^2 n) / (N - k) / N)."""
    defined, tags = group_files(plan["task_dir"])
    inline = inline_groups(defined)
    for g in plan["groups"]:
        y = defined[g] if g in defined else inline[g]
        leaves = leaf_tasks(g, defined, tags)
        for am in y.get("aggregate_metric_list") or []:
            filters = am.get("filter_list", "none")
            for f in [filters] if isinstance(filters, str) else filters:
                key = f"{am['metric']},{f}"
                got = [mine[(t, key)] for t in leaves if (t, key) in mine]
                vals, ses, ns = [v for v, _, _ in got], [e for _, e, _ in got], [n for _, _, n in got]
                w = ns if am.get("weight_by_size", False) else [1] * len(ns)
                want = sum(v * x for v, x in zip(vals, w)) / sum(w)
                if "N/A" in ses:
                    se = "N/A"
                else:
                    N = sum(ns)
                    se = math.sqrt(sum((n - 1) * e * e * n for n, e in zip(ns, ses)) / (N - len(ns)) / N)
                have = results[g][key]
                hse = results[g][f"{am['metric']}_stderr,{f}"]
                print(f"group {g} {key} over {len(got)} tasks ({sum(ns)} documents): nekton {have!r} "
                      f"reference {want!r}; stderr nekton {hse!r} reference {se!r}")
                check(abs(have - want) <= 1e-12, f"group {g} {key}: {have} want {want}")
                check(hse == se if se == "N/A" else abs(hse - se) <= 1e-12,
                      f"group {g} {key} stderr: {hse} want {se}")


def main(plan_path):
    plan = json.load(open(plan_path))
    results = json.load(open(plan["results"]))["results"]
    samples = {}
    for line in open(plan["samples"]):
        s = json.loads(line)
        samples[(s["task"], s["doc_id"])] = s
    tol = plan.get("ll_tol", 1e-5)
    worst = 0.0
    mine = {}  # (task, "metric,filter") -> (value, stderr, documents), this script's own
    specs = list(plan["tasks"])
    if plan.get("expand"):  # the tasks a group stands for, each on plan["expand_model"]
        defined, tags = group_files(plan["task_dir"])
        for name in plan["expand"]:
            for cfg, folder in expand(name, defined, tags):
                specs.append({"config": cfg, "data_name": folder, "model": plan["expand_model"]})
    for spec in specs:
        task = Task(spec.get("yaml"), plan["data"], spec.get("config"), spec.get("data_name"))
        model = Model(spec["model"])
        c = task.cfg
        metrics = c.get("metric_list") or [{"metric": m} for m in {
            "multiple_choice": ["acc", "acc_norm"], "loglikelihood": ["perplexity", "acc"],
            "loglikelihood_rolling": ["word_perplexity", "byte_perplexity", "bits_per_byte"],
            "generate_until": ["exact_match"]}[task.out]]
        filters = c.get("filter_list") or [{"name": "none", "filter": [{"function": "take_first"}]}]
        items = {(f["name"], m["metric"]): [] for f in filters for m in metrics}
        for i, doc in enumerate(task.docs):
            ctx = "" if task.out == "loglikelihood_rolling" else task.context(doc, plan)
            got = samples[(task.name, i)]
            tgt = task.target(doc)
            if task.out == "multiple_choice":
                ch = task.choices(doc)
                td = "" if plan.get("chat_template") else task.td
                if task.multiple_input:
                    args = [[ctx + x, td + str(tgt)] for x in ch]
                    tgt = task.text(doc)
                else:
                    args = [[ctx, td + x] for x in ch]
                mi = any(m["metric"] == "acc_mutual_info" for m in metrics)
                if mi:  # the unconditional requests follow the conditional ones
                    args += [["", td + x] for x in ch]
                res = [model.loglikelihood(a, b) for a, b in args]
                lls = [r[0] for r in res][: len(ch)]
                uncond = [r[0] for r in res][len(ch):]
                gold = tgt if isinstance(tgt, list) else [tgt]
                gold = [ch.index(g) if isinstance(g, str) else g for g in gold]
                preds = {
                    "acc": max(range(len(lls)), key=lambda k: (lls[k], -k)),
                    "acc_norm": max(range(len(lls)), key=lambda k: (lls[k] / len(ch[k]), -k)),
                    "acc_bytes": max(range(len(lls)), key=lambda k: (lls[k] / len(ch[k].encode()), -k)),
                    "acc_mutual_info": max(range(len(lls)), key=lambda k: (lls[k] - uncond[k], -k)) if mi else None,
                }
                for f in filters:
                    for m in metrics:
                        items[(f["name"], m["metric"])].append(1.0 if preds[m["metric"]] in gold else 0.0)
            elif task.out == "loglikelihood":
                args = [[ctx, task.answer(doc, tgt)]]
                res = [model.loglikelihood(*args[0])]
                for f in filters:
                    for m in metrics:
                        items[(f["name"], m["metric"])].append(
                            res[0][0] if m["metric"] == "perplexity" else float(res[0][1]))
            elif task.out == "loglikelihood_rolling":
                args = [[tgt]]
                ll = model.rolling(tgt)
                res = [(ll, None)]
                for f in filters:
                    for m in metrics:
                        u = len(re.split(r"\s+", tgt)) if m["metric"] == "word_perplexity" else len(tgt.encode())
                        items[(f["name"], m["metric"])].append((ll, u))
            else:
                g = c.get("generation_kwargs") or {}
                until = g.get("until", [task.fd])
                until = [until] if isinstance(until, str) else until
                max_gen = g.get("max_gen_toks", 256)
                args = [[ctx, {"until": until, "max_gen_toks": max_gen, "do_sample": False}]]
                text = model.generate(ctx, until, max_gen)
                check(got["resps"] == [text], f"{task.name} doc {i}: generated {got['resps']} want {text!r}")
                golds = [task.choices(doc)[tgt]] if "doc_to_choice" in c else (
                    [str(x) for x in tgt] if isinstance(tgt, list) else [str(tgt)])
                for f in filters:
                    ans = text
                    for step in f["filter"]:
                        if step["function"] == "regex":
                            ans = regex_filter(ans, step)
                    check(got["filtered_resps"][f["name"]] == ans,
                          f"{task.name} doc {i}: filter {f['name']}: {got['filtered_resps']} want {ans!r}")
                    for m in metrics:
                        items[(f["name"], m["metric"])].append(max(exact_match(ans, gg, m) for gg in golds))
                res = []
            check(got["arguments"] == args, f"{task.name} doc {i}: arguments {got['arguments']!r} want {args!r}")
            for k, r in enumerate(res):
                if r[1] is None:
                    d = abs(got["resps"][k] - r[0])
                else:
                    d = abs(got["resps"][k][0] - r[0])
                    check(got["resps"][k][1] == r[1], f"{task.name} doc {i} request {k}: greedy")
                worst = max(worst, d)
                check(d <= tol, f"{task.name} doc {i} request {k}: loglik {got['resps'][k]} want {r[0]} (|d| {d:.3g})")
        out = results[task.name]
        for f in filters:
            for m in metrics:
                key, xs = (m["metric"], f["name"]), items[(f["name"], m["metric"])]
                name = m["metric"]
                if name in ("word_perplexity", "byte_perplexity"):
                    want, se = math.exp(-sum(a for a, _ in xs) / sum(b for _, b in xs)), "N/A"
                elif name == "bits_per_byte":
                    want, se = -sum(a for a, _ in xs) / sum(b for _, b in xs) / math.log(2), "N/A"
                elif name == "perplexity":
                    ppl = lambda v: math.exp(-sum(v) / len(v))
                    want, se = ppl(xs), bootstrap_stderr(ppl, xs, plan["bootstrap_iters"])
                else:
                    want, se = sum(xs) / len(xs), mean_stderr(xs)
                mine[(task.name, f"{key[0]},{key[1]}")] = (want, se, len(xs))
                have = out[f"{key[0]},{key[1]}"]
                exact = name in ("acc", "acc_norm", "acc_bytes", "acc_mutual_info", "exact_match")
                rel = abs(have - want) / max(abs(want), 1e-300)
                print(f"{task.name} {key[0]},{key[1]}: nekton {have!r} reference {want!r}; stderr nekton {out.get(key[0] + '_stderr,' + key[1])!r}")
                check(have == want if exact else rel <= 1e-5, f"{task.name} {key}: {have} want {want}")
                hse = out[f"{key[0]}_stderr,{key[1]}"]
                se_tol = 1e-12 if name != "perplexity" else 1e-5 * abs(se)
                check((hse == se) if se == "N/A" else abs(hse - se) <= se_tol,
                      f"{task.name} {key} stderr: {hse} want {se}")
    if plan.get("groups"):
        check_groups(plan, results, mine)
    print(f"largest |loglik difference| {worst:.3g}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
