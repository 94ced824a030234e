"""`mlxspec chat`: an interactive terminal chat on a Session.

Tokens are printed as they are accepted; with --show-draft the ones that came
from the draft are green (as LM Studio shows them).  After each reply a one-line
summary: tokens, tok/s, acceptance, mean accepted length, current k, and how
much of the prompt the target had to process (the rest came from the KV cache).

Ctrl-C during a reply stops it after the draft/verify round in progress (the
partial reply stays in the conversation; a second Ctrl-C stops at once, and the
KV caches are rebuilt on the next turn); Ctrl-C at the prompt clears the line;
Ctrl-D or /quit leaves.
"""

from __future__ import annotations

import signal
import sys
import unicodedata

import click

from ..errors import MlxspecError
from ..core.options import check
from ..commands.options import draft_options, kv_bits_options, max_kv_size_option, max_tokens_option, model_options, sampling_kwargs, sampling_options
from ..commands.distributed_option import join, pipeline_option
from ..commands.profile_option import cost_profile_option

GREEN = "\x1b[32m"
DIM = "\x1b[2m"
RESET = "\x1b[0m"
PROMPT = ">>> "

HELP = """commands:
  /stats            figures for the whole session
  /reset            forget the conversation (keeps the system prompt)
  /temp X           sampling temperature (0 = greedy)
  /draft on|off     speculative decoding on or off (the KV cache is kept)
  /system TEXT      set the system prompt (/system alone shows it, /system - clears it)
  /max-tokens N     longest reply
  /save FILE        write the conversation (and settings, stats) as JSON
  /help             this list
  /quit             leave (Ctrl-D too)
Ctrl-C stops a reply; the conversation keeps what was said."""


def printable(text: str) -> str:
    """Model text made safe for a terminal: control characters (escape sequences,
    carriage returns, ...) other than newline and tab become U+FFFD."""
    if text.isprintable():
        return text
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else "\ufffd" for c in text)


def out(text: str = "", end: str = "\n"):
    sys.stdout.write(text + end)
    sys.stdout.flush()


def reply_summary(session, stats) -> str:
    from ..session.session import mean_accepted_length
    from ..core.stats import finish_words

    parts = [f"{stats.generated_tokens} tokens", f"{stats.generation_tps:.1f} tok/s"]
    if stats.draft_proposed:
        parts.append(f"acceptance {100 * stats.acceptance_rate:.1f}% ({stats.draft_accepted}/{stats.draft_proposed})")
        parts.append(f"mean accepted {mean_accepted_length(stats):.2f}")
        parts.append(f"{stats.tokens_per_pass:.2f} tok/pass")
    parts.append(draft_words(session, stats))
    parts.append(f"prompt {stats.prompt_tokens_processed}/{stats.prompt_tokens} tok processed")
    if stats.finish_reason not in (None, "stop"):
        parts.append(f"finish: {finish_words(stats.finish_reason)}")
    return "[" + ", ".join(parts) + "]"


def draft_words(session, stats=None) -> str:
    """What drafting is doing: off, a fixed k, auto, or auto fallen back to plain decoding."""
    if not session.drafting:
        return "draft off"
    policy = session.decoder.policy
    if getattr(policy, "fallback", False):
        tail = (f" ({stats.tokens_plain} plain / {stats.tokens_speculative} drafted-round tokens)"
                if stats is not None else "")
        return f"k=0: fell back to plain decoding, drafting is not predicted to pay here{tail}"
    if getattr(policy, "name", None) == "auto":
        drafted = f", {stats.mean_drafted:.1f} drafted/round" if stats is not None and stats.draft_proposed else ""
        return f"k=auto (up to {policy.max_k}{drafted})"
    return f"k={session.current_k}"


class Chat:
    def __init__(self, session, show_draft: bool = False, color: bool | None = None):
        self.session = session
        self.show_draft = show_draft  # green draft tokens, asked for explicitly: always coloured
        self.color = sys.stdout.isatty() if color is None else color  # dimmed summaries

    # -- one reply ----------------------------------------------------------
    def reply(self, text: str):
        from ..api import ChatTemplateError
        from ..session.session import ContextFullError

        s = self.session
        try:
            stream = s.stream(text)
        except ContextFullError as e:
            out(f"[{e}; use /reset]")
            return
        except ChatTemplateError as e:  # the conversation is kept: /system, /reset or /save can follow
            out(f"[error: {e}; the message was not sent]")
            return
        interrupted = []

        def on_sigint(signum, frame):
            if interrupted:  # a second Ctrl-C: stop now (e.g. during a long prompt); the caches are rebuilt
                raise KeyboardInterrupt
            interrupted.append(True)
            s.cancel()

        old = signal.signal(signal.SIGINT, on_sigint)
        in_draft = False
        try:
            with stream:
                for chunk in stream:
                    piece = printable(chunk.text)
                    if not piece:
                        continue
                    if self.show_draft and chunk.from_draft != in_draft:
                        piece = (GREEN if chunk.from_draft else RESET) + piece
                        in_draft = chunk.from_draft
                    sys.stdout.write(piece)
                    sys.stdout.flush()
        finally:
            signal.signal(signal.SIGINT, old)
            if in_draft:
                sys.stdout.write(RESET)
        out()
        stats = stream.stats
        out(self.dim(reply_summary(s, stats)))
        if stats.finish_reason == "context" or s.near_context_limit:
            out(f"[the conversation uses {s.context_used} of {s.context_length} tokens of context: "
                f"/reset to start over]")

    def dim(self, text):
        return f"{DIM}{text}{RESET}" if self.color else text

    # -- commands -----------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run a slash command; False means quit."""
        s = self.session
        name, _, arg = line.partition(" ")
        name, arg = name.lower(), arg.strip()
        try:
            if name in ("/quit", "/exit", "/bye", "/q"):
                return False
            if name in ("/help", "/?"):
                out(HELP)
            elif name == "/stats":
                out(s.stats.summary())
                out(f"context: {s.context_used} of {s.context_length or '?'} tokens used; "
                    f"drafting {'on (' + draft_words(s) + ')' if s.drafting else 'off'}; temp {s.temp:g}; "
                    f"max tokens {s.max_tokens}")
                if s.last_stats is not None:
                    out(f"last reply: {s.last_stats.summary()}")
            elif name == "/reset":
                s.reset()
                out("[conversation cleared]")
            elif name == "/temp":
                if not arg:
                    out(f"[temp {s.temp:g}]")
                else:
                    s.temp = float(arg)
                    out(f"[temp {s.temp:g}]")
            elif name == "/draft":
                if arg.lower() in ("on", "off"):
                    s.drafting = arg.lower() == "on"
                elif arg:
                    raise MlxspecError("usage: /draft on|off")
                out(f"[drafting {'on' if s.drafting else 'off'}]")
            elif name == "/system":
                if arg not in ("", "-") and not s.chat_template:
                    raise MlxspecError("/system needs the chat template (restart without --ignore-chat-template)")
                if not arg:
                    out(f"[system prompt: {s.system!r}]" if s.system else "[no system prompt]")
                else:
                    s.system = None if arg == "-" else arg
                    out("[system prompt set]" if s.system else "[system prompt cleared]")
            elif name in ("/max-tokens", "/max"):
                try:
                    n = int(arg)
                except ValueError:
                    n = arg
                s.max_tokens = n = check("max_tokens", n)
                out(f"[max tokens {n}]")
            elif name == "/save":
                if not arg:
                    raise MlxspecError("usage: /save FILE")
                path = s.save(arg)
                out(f"[saved {len(s.messages)} messages to {path}]")
            else:
                out(f"[unknown command {name}: /help lists them]")
        except (MlxspecError, ValueError, OSError) as e:
            out(f"[error: {e}]")
        return True

    # -- the loop -------------------------------------------------------------
    def run(self) -> int:
        while True:
            try:
                line = input(PROMPT if sys.stdin.isatty() else "")  # piped input: no prompts in the output
            except EOFError:
                out()
                return 0
            except KeyboardInterrupt:
                out("\n[use /quit or Ctrl-D to leave]")
                continue
            try:
                text = line.strip()
                if not text:
                    continue
                if text.startswith("/"):
                    if not self.command(text):
                        return 0
                    continue
                self.reply(line)
            except KeyboardInterrupt:  # a Ctrl-C outside a reply (e.g. just after it ended)
                out("\n[interrupted]")
            except MlxspecError as e:
                out(f"[error: {e}]")


@click.command()
@model_options
@sampling_options
@click.option("--system-prompt", "--system", "system", default=None, help="A system message (chat template only; --system: the old name).")
@max_tokens_option(1024, "Longest reply.")
@click.option("--show-draft", is_flag=True, help="Colour tokens that came from the draft (green).")
@draft_options
@cost_profile_option()
@max_kv_size_option
@kv_bits_options
@pipeline_option
@click.option("--ignore-chat-template", is_flag=True,
              help="No chat template: each message is fed as raw text continuing the conversation so far "
                   "(the way to chat with a base model; a model without a template otherwise gets a plain "
                   "'User:/Assistant:' transcript).")
def chat(model, draft, no_draft, system, max_tokens, show_draft, num_draft, num_draft_max, drafter,
         draft_p_min, draft_vocab, tree, max_kv_size, ignore_chat_template, cost_profile=None, kv_bits=None,
         kv_group_size=64, pipeline=False, **opts):
    """Interactive chat in the terminal."""
    from ..device import describe
    from ..models.loading import load
    from ..session.session import Session

    if ignore_chat_template and system is not None:
        raise click.BadParameter("needs the chat template (drop --ignore-chat-template)",
                                 param_hint="'--system-prompt'")
    uses_draft_model = drafter in (None, "model", "hybrid") or draft is not None
    shard = join(pipeline, drafter)  # under mlx.launch: the target split over the ranks (distributed/)
    pair = load(model, draft, no_draft=no_draft or not uses_draft_model, shard=shard)
    if shard is not None and shard.rank:
        return shard.follow(pair.target)  # ranks >= 1 follow rank 0's target passes (stdin is rank 0's)
    try:
        session = Session(pair, system=system, max_tokens=max_tokens, num_draft=num_draft, p_min=draft_p_min,
                          drafter="none" if no_draft else drafter, tree=tree, max_kv_size=max_kv_size,
                          chat_template=not ignore_chat_template, num_draft_max=num_draft_max,
                          draft_vocab=draft_vocab, cost_profile=cost_profile, kv_bits=kv_bits,
                          kv_group_size=kv_group_size, **sampling_kwargs(opts))
    except ValueError as e:
        raise MlxspecError(str(e)) from e
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    out(f"[{pair.describe()}; {describe()}]")
    if ignore_chat_template:
        out("[--ignore-chat-template: each message is fed as raw text, exactly as typed, continuing the conversation]")
    elif not getattr(pair.tokenizer, "chat_template", None):
        out("[this model has no chat template: using a plain 'User:/Assistant:' transcript "
            "(--ignore-chat-template feeds your messages as raw text instead)]")
    out("[/help for commands, Ctrl-C stops a reply, Ctrl-D quits]")
    Chat(session, show_draft=show_draft).run()
