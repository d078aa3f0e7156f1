"""A Megatron-LM launch script or argument list read as {argument: value}.

A script is read as its shell words: `NAME=value` assignments are substituted into `$NAME` /
`${NAME}` (with `${NAME:-default}`), integer arithmetic `$((...))` is expanded as bash does, an
expansion holding `--flags` is split into words as the shell running it splits it, and `;`
ends a command. Everything that is not a `--flag` and its values (array syntax, torchrun,
the script path, the script's own `case` patterns such as `--data)`) is skipped. No branch of
an `if` is evaluated: both are read, so a flag they give with different values is kept as
Conflicting and refused where the importer reads it. A here-document that `cat` writes to a file
(`cat <<EOT > $DS_CONFIG`, Megatron-DeepSpeed's examples writing their DeepSpeed config) is
kept as that file's text, its variables substituted as the shell does where its delimiter is
unquoted.
"""

from __future__ import annotations

import ast
import re
import shlex

from ..errors import InputError
from .common import Conflicting
from .megatron_deepspeed import STORE_TRUE as MEGATRON_DEEPSPEED_STORE_TRUE

# Megatron-LM's store-true arguments (megatron/training/arguments.py): they take no value
STORE_TRUE = {"fp16", "bf16", "swiglu", "sequence-parallel", "use-distributed-optimizer", "overlap-grad-reduce",
              "overlap-param-gather", "tp-comm-overlap", "untie-embeddings-and-output-weights",
              "disable-bias-linear", "group-query-attention", "recompute-activations", "use-flash-attn",
              "grad-reduce-in-bf16", "accumulate-allreduce-grads-in-fp32", "use-mcore-models", "mock-data",
              "fp8-param-gather", "fp4-param-gather", "apply-layernorm-1p", "cross-entropy-loss-fusion",
              "calculate-per-token-loss",
              "manual-gc", "log-throughput", "profile", "no-create-attention-mask-in-dataloader",
              "no-mmap-bin-files", "no-scatter-gather-tensors-in-pipeline", "use-megatron-fsdp", "use-torch-fsdp2",
              "moe-grouped-gemm", "multi-latent-attention", "moe-pad-expert-input-to-capacity",
              "moe-shared-expert-overlap", "overlap-moe-expert-parallel-comm", "moe-router-force-load-balancing",
              "moe-permute-fusion", "moe-router-fusion", "moe-router-enable-expert-bias",
              "moe-router-padding-for-quantization", "moe-router-padding-for-fp8",
              "moe-use-legacy-grouped-gemm", "moe-router-pre-softmax", "moe-per-layer-logging",
              "moe-shared-expert-gate", "moe-apply-probs-on-input", "quick-geglu", "squared-relu",
              "account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split",
              "moe-extended-tp", "checkpoint-activations", "distribute-checkpointed-activations",
              "distribute-saved-activations", "fp32-residual-connection", "fp32-allreduce"}


STORE_TRUE |= MEGATRON_DEEPSPEED_STORE_TRUE

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ARITH = re.compile(r"\$\(\((.*?)\)\)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# a here-document's first line: the command, `<<` or `<<-`, the delimiter (quoted or not), the rest
_HEREDOC = re.compile(r"^(?P<head>.*?)<<(?P<dash>-?)\s*(?P<quote>['\"]?)(?P<end>[A-Za-z_][A-Za-z0-9_]*)(?P=quote)"
                      r"(?P<tail>.*)$")
_HEREDOC_MARK = "__llmsim_here_document_{}__"
_TARGET = re.compile(r"(?<![0-9&>])>\s*([^&\s>]\S*)")  # `> file` (not `2>&1`, not `>>`)


def _here_documents(text: str) -> tuple[str, list]:
    """The script with the body of each here-document that writes a file removed and a marker
    word where it was, and those documents as (target file expression, body, whether its
    variables are substituted). A document fed to a command (`sbatch <<EOF`: a script the
    command runs) stays in the text, read as the rest is."""
    lines, out, docs = text.split("\n"), [], []
    i = 0
    while i < len(lines):
        m = _HEREDOC.match(lines[i])
        # a file written by `cat` (`cat <<EOT > $DS_CONFIG`, `cat > file <<EOT`)
        writes = m and re.match(r"\s*cat\b", m.group("head"))
        target = _TARGET.search(m.group("head") + " " + m.group("tail")) if writes else None
        if not target or m.group("head").rstrip().endswith("<"):  # a here-string (<<<) is no document
            out.append(lines[i])
            i += 1
            continue
        body, i = [], i + 1
        while i < len(lines) and (lines[i].lstrip("\t") if m.group("dash") else lines[i]).strip() != m.group("end"):
            body.append(lines[i].lstrip("\t") if m.group("dash") else lines[i])
            i += 1
        i += 1  # the delimiter line
        docs.append((target.group(1), "\n".join(body) + "\n", not m.group("quote")))
        out.append(f"{m.group('head')} {_HEREDOC_MARK.format(len(docs) - 1)}")
    return "\n".join(out), docs


def script_words(text: str, files: dict | None = None) -> list[str]:
    """The shell words of a launch script with simple variables and integer arithmetic
    (`$((GPUS * NODES))`) substituted; `files`, where given, receives the files its
    here-documents write ({path as the script names it, variables substituted: text})."""
    text, docs = _here_documents(text)
    text = text.replace("\\\n", " ")
    text = _ARITH.sub(lambda e: "$((" + re.sub(r"\s+", "", e.group(1)) + "))", text)  # one word, as bash reads it
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";")  # `;` ends a command, as in bash
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError as exc:
        raise InputError("megatron", "script", f"cannot split it into shell words ({exc})") from None
    env: dict[str, str] = {}
    out = []
    marks = {_HEREDOC_MARK.format(i): doc for i, doc in enumerate(docs)}
    for word in words:
        if word in marks:
            target, body, expand = marks[word]
            if files is not None:
                files[_substitute(target, env)] = _substitute(body, env) if expand else body
            continue
        m = _ASSIGN.match(word)
        if m and not m.group(2).startswith("("):
            env[m.group(1)] = _substitute(m.group(2), env)
            continue
        expanded = _substitute(word, env)
        # a variable holding the arguments (`options="--tp 8 ..."`, `sh -c "python x.py ${options}"`,
        # Megatron-LM's own examples of 2021) is split into them, as the shell running it does;
        # a literal quoted text (an echo's message) stays one word
        split = expanded.startswith("--") or "$" in word and " --" in expanded
        out.extend(expanded.split() if split else [expanded])
    return out


def _substitute(word: str, env: dict) -> str:
    word = _VAR.sub(lambda v: env.get(v.group(1) or v.group(3), v.group(2) or v.group(0)), word)
    return _ARITH.sub(lambda e: _arithmetic(e.group(1), env, e.group(0)), word)


def _arithmetic(expression: str, env: dict, text: str) -> str:
    """The value of a shell arithmetic expansion over integers (bash: `/` truncates toward
    zero, `%` keeps the dividend's sign); `text` unchanged where it is anything else."""
    expression = _NAME.sub(lambda n: env.get(n.group(0), n.group(0)), expression)
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return text

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if left is None or right is None or abs(left) > 10**12 or abs(right) > 10**12:
                return None
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right:
                quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right > 0) else -1)
                return quotient if not isinstance(node.op, ast.Mod) else left - right * quotient
        return None

    result = value(tree)
    return text if result is None else str(result)


def parse_args(words: list[str]) -> dict:
    """{flag name (no dashes): value} of the `--flag [value...]` words; store-true flags are True,
    a flag with several values gets a list. A flag repeated with the same value is read once;
    with different values (both branches of a script's `if`) it is refused only if read."""
    args: dict = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--") or len(word) < 3:
            continue
        name, _, inline = word[2:].partition("=")
        if name.endswith(")") or "|" in name:
            continue  # not a flag: a `case` pattern of the script's own options (`--data)`)
        values = [inline] if inline else []
        if name not in STORE_TRUE and not inline:
            while i < len(words) and not words[i].startswith("--") and _is_value(words[i]):
                values.append(words[i])
                i += 1
        value = True if not values else (values[0] if len(values) == 1 else values)
        if name in args and args[name] != value:
            before = args[name]
            value = Conflicting((*before, value) if isinstance(before, Conflicting) else (before, value))
        args[name] = value
    return args


def _is_value(word: str) -> bool:
    """A word that belongs to the preceding flag (not array syntax, a program, or a script)."""
    return not (word in ("(", ")", "torchrun", "python", "python3") or word.endswith(("=(", ".py"))
                or word.startswith("${") and word.endswith("[@]}"))
