"""outputs keep their tokens in content-addressed payloads: one `payloads` row per distinct output, shared by
every pass and run that produced it (evalgate/records/payload.py `encode_payload`). Digests are unchanged, so
runs stored before this compare with runs stored after it.

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op

from evalgate.records import Completion, decode_payload, encode_payload, pack_floats, pack_ids, unpack_floats, unpack_ids
from evalgate.store.portable import NulSafeText

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

CHUNK = 2000

# The columns 0001 gave outputs for their tokens (int32 / float64 arrays, docs/storage.md before 0009).
OLD_COLUMNS = {"output_ids": sa.LargeBinary, "logprobs": sa.LargeBinary, "top_k": sa.Integer,
               "top_ids": sa.LargeBinary, "top_logprobs": sa.LargeBinary, "token_texts": sa.JSON, "text": NulSafeText}


def pack_top(completion: Completion) -> tuple[int, bytes, bytes]:
    """A completion's top-k in the 0001 encoding (columns top_k, top_ids, top_logprobs): rows padded to k with
    id -1 and logprob -inf, as int32 / float64 arrays. Written by `downgrade`."""
    rows = list(zip(*completion.top_rows()))
    k = max((len(ids) for ids, _ in rows), default=0)
    ids: list[int] = []
    lps: list[float] = []
    for row_ids, row_lps in rows:
        pad = k - len(row_ids)
        ids += row_ids + [-1] * pad
        lps += row_lps + [float("-inf")] * pad
    return k, pack_ids(ids), pack_floats(lps)


def unpack_top(k: int, ids_blob: bytes, lps_blob: bytes) -> tuple[list[list[int]], list[list[float]]]:
    """The rows of a top-k in the 0001 encoding (`pack_top`), padding dropped. Read by `upgrade`."""
    ids, lps = unpack_ids(ids_blob), unpack_floats(lps_blob)
    if k == 0:
        return [], []
    rows_ids = [ids[i : i + k] for i in range(0, len(ids), k)]
    rows_lps = [lps[i : i + k] for i in range(0, len(lps), k)]
    return (
        [[t for t in row if t != -1] for row in rows_ids],
        [[v for t, v in zip(ri, rl) if t != -1] for ri, rl in zip(rows_ids, rows_lps)],
    )


def _outputs(*columns):
    return sa.table("outputs", sa.column("id", sa.Integer()), *columns)


payloads = sa.table("payloads", sa.column("hash", sa.String()), sa.column("data", sa.LargeBinary()))


def upgrade() -> None:
    op.create_table("payloads", sa.Column("hash", sa.String(length=64), nullable=False),
                    sa.Column("data", sa.LargeBinary(), nullable=False), sa.PrimaryKeyConstraint("hash"))
    with op.batch_alter_table("outputs") as batch:
        batch.add_column(sa.Column("payload_hash", sa.String(length=64), nullable=True))
    conn = op.get_bind()
    old = _outputs(*[sa.column(name, kind()) for name, kind in OLD_COLUMNS.items()])
    target = _outputs(sa.column("payload_hash", sa.String()))
    seen: set[str] = set()
    last = 0
    while True:
        rows = conn.execute(sa.select(old).where(old.c.id > last).order_by(old.c.id).limit(CHUNK)).fetchall()
        if not rows:
            break
        new_payloads, hashes = [], []
        for row in rows:
            top_ids, top_lps = unpack_top(row.top_k, row.top_ids, row.top_logprobs)
            completion = Completion(key="", prompt_ids=[], output_ids=unpack_ids(row.output_ids),
                                    logprobs=unpack_floats(row.logprobs), top_ids=top_ids, top_logprobs=top_lps,
                                    token_texts=list(row.token_texts or []), text=row.text or "", finish_reason="")
            payload_hash, data = encode_payload(completion)
            if payload_hash not in seen:
                seen.add(payload_hash)
                new_payloads.append({"hash": payload_hash, "data": data})
            hashes.append({"row_id": row.id, "payload_hash": payload_hash})
        if new_payloads:
            conn.execute(payloads.insert(), new_payloads)
        conn.execute(target.update().where(target.c.id == sa.bindparam("row_id"))
                     .values(payload_hash=sa.bindparam("payload_hash")), hashes)
        last = rows[-1].id
    with op.batch_alter_table("outputs") as batch:
        for name in OLD_COLUMNS:
            batch.drop_column(name)
        batch.alter_column("payload_hash", existing_type=sa.String(length=64), nullable=False)
        batch.create_foreign_key("fk_outputs_payload_hash_payloads", "payloads", ["payload_hash"], ["hash"])


def downgrade() -> None:
    with op.batch_alter_table("outputs") as batch:
        for name, kind in OLD_COLUMNS.items():
            batch.add_column(sa.Column(name, kind(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(sa.text("select outputs.id, payloads.data from outputs join payloads "
                                "on payloads.hash = outputs.payload_hash")).fetchall()
    old = _outputs(*[sa.column(name, kind()) for name, kind in OLD_COLUMNS.items()])
    for row in rows:
        ids, lps, top_ids, top_lps, token_texts, text = decode_payload(bytes(row.data))
        completion = Completion(key="", prompt_ids=[], output_ids=ids, logprobs=lps, top_ids=top_ids,
                                top_logprobs=top_lps, token_texts=token_texts, text=text, finish_reason="")
        k, top_ids_blob, top_lps_blob = pack_top(completion)
        conn.execute(old.update().where(old.c.id == row.id).values(
            output_ids=pack_ids(ids), logprobs=pack_floats(lps), top_k=k, top_ids=top_ids_blob,
            top_logprobs=top_lps_blob, token_texts=token_texts, text=text))
    with op.batch_alter_table("outputs") as batch:
        batch.drop_constraint("fk_outputs_payload_hash_payloads", type_="foreignkey")
        batch.drop_column("payload_hash")
        for name, kind in OLD_COLUMNS.items():
            batch.alter_column(name, existing_type=kind(), nullable=False)
    op.drop_table("payloads")
