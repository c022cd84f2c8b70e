from tests.ingest.detection.runs import RunBuilder, interventions


def test_the_same_question_after_the_user_answered_is_a_clarification_loop():
    # Word for word, the 2nd time; in other words (a rephrasing may ask for more), the 3rd.
    verbatim = RunBuilder().say("Could you tell me your order number?").user("It is 1042.")
    verbatim.say("Could you tell me your order number?")
    found = interventions(verbatim.detect())
    assert (found[0].kind, found[0].at_round) == ("clarification", 2)
    paraphrased = RunBuilder().say("Could you tell me your order number?").user("It is 1042.")
    paraphrased.say("What is your order number, please?")
    assert interventions(paraphrased.detect()) == []
    paraphrased.user("1042, as I said.").say("Please tell me the order number.")
    found = interventions(paraphrased.detect())
    assert (found[0].kind, found[0].at_round) == ("clarification", 3)


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


# --- the conversation: the user's turns are input -------------------------------------------------


def test_asking_again_after_i_dont_have_it_is_not_a_clarification_loop():
    run = RunBuilder().say("Could you give me your reservation number?")
    run.user("I don't have it with me right now, sorry.")
    run.say("Could you give me your reservation number?")
    run.user("I still can't find it.")
    run.say("Could you give me your reservation number?")
    assert interventions(run.detect()) == []
    run.user("It is ZX81QT.").say("Could you give me your reservation number?")
    assert [d.kind for d in interventions(run.detect())] == ["clarification"]


def test_putting_a_decision_again_after_a_refusal_is_not_a_clarification_loop():
    # The agent holding its policy: offering the same choice again is not asking for information.
    run = RunBuilder().user("Refund it to my other card.")
    for n in range(4):
        run.say("I can only refund to the original payment method. Would you like me to proceed with that?")
        run.user(f"No, I want it on my other card, that is final ({n}).")
    assert [d for d in interventions(run.detect()) if d.kind == "clarification"] == []


def test_asking_again_after_the_answer_was_tried_and_failed_is_the_next_step():
    run = RunBuilder().say("Could you please provide your email address?").user("it is ana@example.com")
    run.call(
        "find_user_by_email",
        {"email": "ana@example.com"},
        {"error": "not found"},
        status="error",
        error_class="not_found",
    )
    run.say("Could you please provide your email address?").user("try ana.s@example.com")
    run.call(
        "find_user_by_email",
        {"email": "ana.s@example.com"},
        {"error": "not found"},
        status="error",
        error_class="not_found",
    )
    run.say("Could you please provide your email address?")
    assert interventions(run.detect()) == []


def test_could_you_rephrase_while_the_user_repeats_themselves_is_a_loop():
    run = RunBuilder().user("I want to change the passenger name from Mei Lee to Mei Garcia.")
    run.say("Could you please provide the date and flight number of the reservation?")
    run.user("I just want the name changed from Mei Lee to Mei Garcia.")
    run.say("Sorry, could you rephrase what you need exactly?")
    run.user("I only need the name changed from Mei Lee to Mei Garcia, please.")
    run.say("Could you tell me which flight this is about?")
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_round) == ("clarification", 3)
    assert found[0].evidence["requests"] == 3


def test_harness_messages_are_not_the_user_and_their_streak_is_a_repeated_error():
    nudge = "No tool calls found in the response. Every response MUST include at least one tool call."
    run = RunBuilder().user("Fix the failing test in utils.py.")
    run.call("bash", {"command": "pytest -x"}, "1 failed", kind="other")
    for _ in range(4):
        run.events.append(run._event("user_message", text=nudge, sender="harness"))
    assert interventions(run.detect()) == []  # four rejections that then stop are common
    run.events.append(run._event("user_message", text=nudge, sender="harness"))
    found = interventions(run.detect())
    assert (found[0].kind, found[0].count, found[0].evidence["error_class"]) == (
        "repeated_error",
        5,
        "harness",
    )
    # A tool call in between starts the streak over.
    broken = RunBuilder()
    for n in range(8):
        broken.events.append(broken._event("user_message", text=nudge, sender="harness"))
        if n % 4 == 3:
            broken.call("bash", {"command": f"ls {n}"}, "ok", kind="read")
    assert interventions(broken.detect()) == []


def test_a_harness_message_is_not_news_that_excuses_restating():
    run = RunBuilder().say("I will now run the test suite.")
    run.events.append(run._event("user_message", text="Please use a tool.", sender="harness"))
    run.say("I will now run the test suite.")
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_round) == ("monologue", 2)


def test_answering_a_new_user_turn_in_the_same_words_is_not_a_monologue():
    run = RunBuilder().say("Your order A-1 ships tomorrow. Anything else I can help with?")
    run.user("And when does order A-7 ship? It was placed last week.")
    run.say("Your order A-1 ships tomorrow. Anything else I can help with?")
    assert interventions(run.detect()) == []


def test_restating_while_the_user_only_repeats_is_a_monologue_at_the_third():
    run = RunBuilder().say("A human agent will be with you shortly.").user("Okay, I will wait.")
    run.say("A human agent will be with you shortly.").user("Okay, I will wait.")
    assert interventions(run.detect()) == []
    run.say("A human agent will be with you shortly.")
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_round) == ("monologue", 3)


def test_a_tool_call_written_in_the_text_again_and_again_is_a_monologue():
    printed = '{"name": "cancel_reservation", "arguments": {"reservation_id": "H8Q05L"}}'
    run = RunBuilder().say(f"Understood, only the insurance.\n{printed}").user("Only the insurance please!")
    run.say(f"Got it: nothing else.\n{printed}").user("Please do not cancel my flight itself.")
    assert interventions(run.detect()) == []
    run.say(f"Sure, just the insurance then.\n{printed}")
    found = interventions(run.detect())
    assert (found[0].kind, found[0].at_round, found[0].count) == ("monologue", 3, 3)


def test_alike_does_not_match_a_word_inside_a_long_text():
    from ingest.detection.text import alike

    assert not alike("6", "yes the allowance of 6 checked bags is per passenger", 0.85)
    assert alike("could you tell me your order number", "could you tell me your order number please", 0.85)
    long_a, long_b = "x" * 5000, "x" * 5000
    assert alike(long_a, long_b, 0.85)


def test_requests_answered_yes_one_after_another_are_a_walk_through_not_a_loop():
    run = RunBuilder().user("Please ship my order to the new address.")
    run.say("Could you confirm the address is 12 Rue de Rivoli, Paris?").user("Yes.")
    run.say("Could you confirm the order is A-4412, the blue mug?").user("Yes, that's right.")
    run.say("Could you confirm the delivery can be left with a neighbour?").user("Sure.")
    run.say("Could you confirm you want standard shipping?")
    assert interventions(run.detect()) == []
