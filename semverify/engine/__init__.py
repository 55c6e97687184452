"""The decoding engine, apart from loading, costs and methods: the loop (`loop`) and a step's state (`step`), its
rows (`rows`), the KV caches (`cache`) and attention layouts (`architectures`), verification (`verification`,
`tree`, `width_groups`), drawing from a rule's law (`drawing`), the sampler's warp (`sampling`), noise (`noise`,
`coupling`), how drafters are driven (`drafting`) and the step clock (`clock`). It imports nothing from the methods.

Glossary: the engine's working words, each once (B rows, k draft tokens a row, V the vocabulary, H the hidden size).

- **row**: one sequence of the batch; rows are indexed in the current batch, which shrinks as rows finish
  (``Rows.index`` keeps each row's place in the caller's batch).
- **sequence** [T]: a row's prompt, then its output so far (a view of ``Rows.tokens``).
- **step**: draft -> verify -> settle -> next, once for every row together (`Step`).
- **draft** [B, n]: the tokens a drafter proposes for a step (`Draft`), of one **kind**: a ``chain`` (k tokens a
  row), ``chains`` (rows drafted together with different ``lengths``), a ``tree`` (``parents`` [n]) or ``rows``
  (each row drafted apart: its own chain, tree or step). **node**: a draft token; the **root** is the row's last
  verified token, which a draft hangs from.
- **budget**: how many draft tokens a row may propose this step (k, within ``max_new_tokens``, leaving room for
  the next token).
- **waiting** [B]: rows whose draft is not finished (a long step draft); they sit out the step's verification.
  **ready**: the rows verified this step (all rows but the waiting ones).
- **unseen** [B, u]: the tokens of each row the target has not run over yet, left-padded (`Unseen`): the prompts,
  then each step's next token; the draft enters the cache after them, at column **start**.
- **hole**: a cache column no query may attend to (padding, or a rejected draft token of one row in a batch);
  **pack**: move each row's held tokens to the right of a batched cache, so holes do not pile up.
- **path**: the draft nodes a rule judged for a row, root to leaf (a chain's path is all its tokens).
- **verdict**: the rule's decision over the ready rows (`Verdict`): ``n_accepted`` [B], ``next_token`` [B],
  ``reasons`` {name: [B, k]}.
- **accepted** (or **kept**): the draft tokens at the head of a row's path that the rule keeps, ``n_accepted``.
- **next token**: the one token the step adds after the accepted ones: the refusal's token where the rule
  refused a draft token (vLLM's recovered token), the target's own after a full draft (vLLM's bonus token).
- **law**: what a token rule decides at each position, stated as distributions (`TokenLaw`); the engine draws
  from it (`drawing`). **emitted law**: the law of the token a position emits.
- **noise**: where a step's random draws come from (`noise.Noise`): a **stream** (a ``torch.Generator``), one
  per row, or **coupled** (public Gumbel noise keyed by output **position**, so methods share their draws).
- **emitted**: what a step adds to a row (`Emitted`): its accepted tokens then the next token, cut at a stop.
- **settle**: after the verdict, emit each ready row's tokens, keep them in the cache and the drafter, and count
  the step. **outcome**: what one step did for a row (`StepOutcome`), fed back to adaptive drafters.
- **going**: the rows that generate on after a step; the others leave the batch with their output.
- **tail** [B, L]: the last L output tokens of each row, right-aligned (-1 before its output), for rules that
  read the output so far.
- **width group**: rows of similar draft length verified in one forward, so a short draft is not padded to the
  longest (`width_groups`, on a CPU).
"""
