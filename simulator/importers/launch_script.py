"""A Megatron-LM launch script or argument list read as {argument: value}.

A script is read as its shell words: `NAME=value` assignments are substituted into `$NAME` /
`${NAME}` (with `${NAME:-default}`), integer arithmetic `$((...))` is expanded as bash does, an
expansion holding `--flags` is split into words as the shell running it splits it, and `;`
ends a command. Everything that is not a `--flag` and its values (array syntax, torchrun,
the script path, the script's own `case` patterns such as `--data)`) is skipped. An `if`
whose test compares known values runs its true branch only (_Branches); where the test cannot be
told (an unknown variable, a file test, a command) every branch is read, so a flag they give with
different values is kept as Conflicting and refused where the importer reads it. A here-document that `cat` writes to a file
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
    branches = _Branches()
    for word in words:
        if branches.consumes(word, env) or not branches.active:
            continue
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
        if expanded or "$" not in word:  # an empty expansion is no word, as the shell splits it
            out.extend(expanded.split() if split else [expanded])
    return out


class _Branches:
    """Which words of an `if ... then ... elif ... else ... fi` the shell runs: a branch whose
    condition is false (a `[ ]` or `[[ ]]` test of known values: = == != -eq -ne -lt -le -gt -ge
    -z -n, with ! && ||) is skipped, one whose condition cannot be told (an unknown variable, a
    file test, a command) is read, as is every branch after it."""

    def __init__(self):
        self.frames: list[dict] = []  # per open `if`: its parent's activity, the branch's, the condition words
        self.condition: list[str] | None = None  # the words of the test being read

    @property
    def active(self) -> bool:
        return not self.frames or self.frames[-1]["active"]

    def consumes(self, word: str, env: dict) -> bool:
        """Whether `word` belongs to the control structure (and so is not a command's word)."""
        if self.condition is not None:
            if word != "then":
                self.condition.append(word)
                return True
            self._enter(_condition([_substitute(w, env) for w in self.condition if w != ";"]))
            self.condition = None
            return True
        if word == "if":
            self.frames.append({"outer": self.active, "active": False, "taken": False})
            self.condition = []
            return True
        if not self.frames:
            return False
        frame = self.frames[-1]
        if word == "elif":
            self.condition = []
            return True
        if word == "else":
            frame["active"] = frame["outer"] and frame["taken"] is not True
            return True
        if word == "fi":
            self.frames.pop()
            return True
        return False

    def _enter(self, value) -> None:
        """A branch whose condition is `value` (True, False or None: unknown) begins."""
        frame = self.frames[-1]
        frame["active"] = frame["outer"] and frame["taken"] is not True and value is not False
        if value is True and frame["taken"] is False:
            frame["taken"] = True
        elif value is None:
            frame["taken"] = None  # no later branch can be ruled out


_TESTS = {"=": lambda a, b: a == b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
_NUMERIC = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__,
            "-ge": int.__ge__}


def _condition(words: list[str]):
    """True, False or None (unknown) for an `if` condition of `[ ]` / `[[ ]]` tests joined by
    && and || (evaluated left to right, as the shell does)."""
    op, group = None, []
    result: object = "start"
    for word in words + ["||"]:
        if word not in ("&&", "||"):
            group.append(word)
            continue
        value = _test(group)
        if result == "start":
            result = value
        elif op == "&&":
            result = False if False in (result, value) else (True if result is True and value is True else None)
        else:
            result = True if True in (result, value) else (False if result is False and value is False else None)
        op, group = word, []
    return None if result == "start" else result


def _test(words: list[str]):
    if len(words) < 2 or (words[0], words[-1]) not in (("[", "]"), ("[[", "]]")):
        return None  # a command, or no test
    inner = words[1:-1]
    negate = bool(inner) and inner[0] == "!"
    inner = inner[1:] if negate else inner
    if any("$" in w or "`" in w for w in inner):
        return None
    if len(inner) == 2 and inner[0] in ("-z", "-n"):
        value = (inner[1] == "") == (inner[0] == "-z")
    elif len(inner) == 3 and inner[1] in _TESTS:
        value = _TESTS[inner[1]](inner[0], inner[2])
    elif len(inner) == 3 and inner[1] in _NUMERIC:
        try:
            value = _NUMERIC[inner[1]](int(inner[0]), int(inner[2]))
        except ValueError:
            return None
    else:
        return None
    return value != negate


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
