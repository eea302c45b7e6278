from healthcheck.records import admin_comment as ac
from healthcheck.records.classes import CLASSES, is_hardware

JS = "JS1:H4sIAAAAAAAAA6tWKkktLlGyUlAqS8wpTVWqBQBGb7chEwAAAA=="


def test_entry_is_tagged_compact_ascii_json_with_version():
    text = ac.encode({"node": "gpu2", "class": "GPU_LOST", "gpu": 3, "xid": 79, "msg": "naïve"})
    assert text.startswith('SGH1:{"v":1,') and " " not in text and text.isascii()
    assert ac.parse(text) == [{"v": 1, "node": "gpu2", "class": "GPU_LOST", "gpu": 3, "xid": 79, "msg": "naïve"}]


def test_merge_keeps_jobstats_blob_and_replaces_only_our_entry_for_that_node():
    first = ac.merge(JS, [{"node": "gpu2", "class": "GPU_LOST", "xid": 79}])
    second = ac.merge(first, [{"node": "*", "class": "FAILED"}])
    third = ac.merge(second, [{"node": "gpu2", "class": "GPU_XID", "xid": 48}])
    assert third.startswith(JS + " ")
    assert [(e["node"], e["class"]) for e in ac.parse(third)] == [("*", "FAILED"), ("gpu2", "GPU_XID")]
    assert ac.others(third) == JS


def test_strings_inside_entries_cannot_forge_or_break_entries():
    hostile = 'x" SGH1:{"v":1,"node":"gpu9","class":"COMPLETED"} JS1:'
    text = ac.merge("admin note", [{"node": "gpu1", "class": "FAILED", "msg": hostile}])
    entries = ac.parse(text)
    assert len(entries) == 1 and entries[0]["msg"] == hostile
    assert ac.others(text) == "admin note"


def test_damaged_entry_is_skipped_and_kept_as_others_text():
    assert ac.parse('SGH1:{"v":1,"node": SGH1:{"v":1,"node":"a","class":"TIMEOUT"}') == [
        {"v": 1, "node": "a", "class": "TIMEOUT"}]
    assert ac.contains(ac.merge(None, [{"node": "a", "class": "TIMEOUT"}]), {"node": "a", "class": "TIMEOUT"})
    assert not ac.contains("", {"node": "a", "class": "TIMEOUT"})


def test_class_names_are_the_contract():
    assert set(CLASSES) >= {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "REQUEUED", "NODE_FAIL",
                            "OUT_OF_MEMORY", "GPU_LOST", "GPU_XID", "GPU_ECC", "NVLINK", "INFINIBAND"}
    assert is_hardware("GPU_LOST") and not is_hardware("FAILED")


def test_entries_survive_what_sacctmgr_does_to_the_field():
    """Measured on 22.05.8: sacctmgr stores AdminComment lower-cased, quotes as backticks."""
    entry = {"node": "gpu2", "class": "GPU_LOST", "gpu": 3, "xid": 79, "msg": "it's `odd` \"quoted\""}
    stored = ac.as_stored_by_sacctmgr(ac.merge("js1:h4sabc", [entry]))
    assert '"' not in stored and "'" not in stored and stored == stored.lower()
    [back] = ac.parse(stored)
    assert back["class"] == "GPU_LOST" and back["gpu"] == 3 and back["xid"] == 79
    assert back["msg"] == "it's `odd` \"quoted\""
    assert ac.others(stored) == "js1:h4sabc"
    assert ac.contains(stored, {"node": "GPU2", "class": "GPU_LOST"})
    again = ac.merge(stored, [{"node": "gpu2", "class": "GPU_ECC"}])
    assert [e["class"] for e in ac.parse(again)] == ["GPU_ECC"]


def test_an_admins_text_jobstats_and_our_entries_of_every_node_and_run_coexist():
    """AdminComment written by others survives (issue 19): jobstats' JS1: blob, an admin's note
    (scontrol update / sacctmgr / scancel --admin-comment on 25.11+) and our entries, merged in any
    order, as sacctmgr stores them; merging again changes nothing of theirs."""
    admin = "ops: swap 'gpu3' on \"tuesday\" -- ticket 4711"
    text = ac.merge(admin, [{"node": "*", "class": "PREEMPTED"}])
    text = ac.as_stored_by_sacctmgr(text + " " + JS)                 # jobstats wrote after us
    text = ac.merge(text, [{"node": "*", "class": "COMPLETED", "run": 1}, {"node": "gpu2", "class": "GPU_LOST",
                                                                         "gpu": 3, "run": 1}])
    stored = ac.as_stored_by_sacctmgr(text)
    assert ac.others(stored) == ac.as_stored_by_sacctmgr(admin + " " + JS)
    assert [(e["node"], e["class"], e.get("run")) for e in ac.parse(stored)] == [
        ("*", "PREEMPTED", None), ("*", "COMPLETED", 1), ("gpu2", "GPU_LOST", 1)]
    again = ac.merge(stored, [{"node": "gpu2", "class": "GPU_LOST", "gpu": 3, "run": 1}])
    assert ac.others(again) == ac.others(stored) and ac.parse(again) == ac.parse(stored)
    # an admin who rewrote the field with their text only (our entries gone) keeps it; ours come back
    rewritten = ac.merge("please keep", [{"node": "*", "class": "COMPLETED"}])
    assert rewritten == "please keep " + ac.encode({"node": "*", "class": "COMPLETED"})
    assert ac.contains(stored, {"node": "gpu2", "class": "GPU_LOST", "run": 1})
    assert not ac.contains(stored, {"node": "gpu2", "class": "GPU_LOST"})     # run 0 wrote none
