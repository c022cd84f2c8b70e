from tests.ingest.detection.runs import RunBuilder, interventions


def test_the_same_question_after_the_user_answered_is_a_clarification_loop():
    run = RunBuilder().say("Could you tell me your order number?").user("It is 1042.")
    run.say("What is your order number, please?")
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_round) == ("clarification", 2)


def test_asking_once_and_proceeding_is_fine():
    run = RunBuilder().say("Which account should I use?").user("The business one.")
    run.call("get_account", {"type": "business"}, {"id": "A1"}).say("Done: account A1 is active.")
    assert interventions(run.detect()) == []


def test_announcing_the_same_action_without_doing_it():
    run = RunBuilder().say("I will now check the order status.").say("I will now check the order status.")
    found = interventions(run.detect())
    assert found[0].kind == "monologue" and found[0].at_round == 2


def test_empty_responses_in_a_row():
    run = RunBuilder().say("", output_tokens=0).say("", output_tokens=0).say("", output_tokens=1)
    found = interventions(run.detect())
    assert found[0].kind == "empty_responses" and found[0].at_round == 3
